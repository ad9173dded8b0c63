"""parlab.comm sees DTensor's functional collectives (torch.distributed._functional_collectives).

DTensor redistributes through funcol, not through torch.distributed's Python functions, so
before parlab.comm wrapped funcol its tracer saw nothing of a tensor-parallel step. Here the
tracer's events are compared with PyTorch's own counter, `CommDebugMode` (a dispatch mode that
sees the `_c10d_functional` ops under funcol: an independent witness), and its bytes with the
ring formulas written out in the test: an all-gather of a full tensor of n bytes sends
(t-1)/t n per rank, a reduce-scatter of an n-byte input the same, an all-reduce 2(t-1)/t n.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parlab.launch import run

N = 24  # float32 elements per rank: every redistribution below moves whole rows


def redistributions():
    """Each DTensor redistribution that communicates, traced, beside CommDebugMode's counts."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    from parlab import comm

    t, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (t,))
    local = torch.full((N, 2), float(r + 1))
    out = {}
    cases = {
        "shard_to_replicate": lambda: DTensor.from_local(local, mesh, [Shard(0)]).redistribute(
            mesh, [Replicate()]).to_local(),
        "partial_to_replicate": lambda: DTensor.from_local(local, mesh, [Partial()]).redistribute(
            mesh, [Replicate()]).to_local(),
        "partial_to_shard": lambda: DTensor.from_local(local, mesh, [Partial()]).redistribute(
            mesh, [Shard(0)]).to_local(),
        "all_gather_tensor": lambda: funcol.all_gather_tensor(local, 0, list(range(t))),
    }
    for name, fn in cases.items():
        with CommDebugMode() as witness, comm.trace() as tr:
            result = fn()
            float(result.sum())  # waits for the async tensor
        out[name] = {"events": [(e.kind, e.group_ranks, e.nbytes, e.wire_bytes, e.functional)
                                for e in tr.events],
                     "witness": {str(op): n for op, n in witness.get_comm_counts().items()},
                     "sum": float(result.sum())}
    return out


@pytest.mark.parametrize("t", [2, 3])
def test_dtensor_redistributions_are_traced_with_ring_bytes(t):
    res = run(redistributions, t)
    shard = N * 2 * 4  # bytes of one rank's (N, 2) float32 piece
    ranks = tuple(range(t))
    expected = {  # (kind, full payload n, wire bytes) from the ring formulas
        "shard_to_replicate": ("all_gather", t * shard, (t - 1) / t * t * shard),
        "partial_to_replicate": ("all_reduce", shard, 2 * (t - 1) / t * shard),
        "partial_to_shard": ("reduce_scatter", shard, (t - 1) / t * shard),
        "all_gather_tensor": ("all_gather", t * shard, (t - 1) / t * t * shard),
    }
    witness_op = {"all_gather": "all_gather_into_tensor", "all_reduce": "all_reduce",
                  "reduce_scatter": "reduce_scatter_tensor"}
    for rank, out in enumerate(res):
        for name, (kind, n, wire) in expected.items():
            got = out[name]
            assert got["events"] == [(kind, ranks, n, pytest.approx(wire), True)], (rank, name)
            # CommDebugMode saw exactly one collective, of that kind: nothing more, nothing less
            assert list(got["witness"].values()) == [1], (rank, name, got["witness"])
            assert witness_op[kind] in next(iter(got["witness"])), (name, got["witness"])
        # the values moved are right: the tracer's wrapper returns what funcol returns
        total = sum(q + 1 for q in range(t)) * N * 2
        assert out["partial_to_replicate"]["sum"] == total
        assert out["shard_to_replicate"]["sum"] == total


def tp_mlp_step():
    """PyTorch's tensor-parallel MLP on a (2, 2) mesh's "tp" dimension: forward and backward,
    traced, beside CommDebugMode."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from parlab import comm
    from parlab.model import MLP

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mlp = parallelize_module(MLP(8), mesh["tp"], {"fc1": ColwiseParallel(),
                                                  "fc2": RowwiseParallel()})
    x = torch.randn(2, 3, 8, requires_grad=True)
    with CommDebugMode() as witness, comm.trace() as forward:
        y = mlp(x)
        float(y.sum())
    with comm.trace() as backward:
        y.sum().backward()
    return {"forward": [(e.kind, e.group_ranks, e.nbytes) for e in forward.events],
            "backward": [(e.kind, e.group_ranks, e.nbytes) for e in backward.events],
            "witness": sum(witness.get_comm_counts().values())}


def test_a_tensor_parallel_mlp_is_traced_on_its_mesh_dimension():
    res = run(tp_mlp_step, 4)
    activation = 2 * 3 * 8 * 4  # the (2, 3, 8) float32 output and input gradient
    for rank, out in enumerate(res):
        tp_ranks = (2 * (rank // 2), 2 * (rank // 2) + 1)  # arange(4).view(2, 2)'s rows
        assert out["forward"] == [("all_reduce", tp_ranks, activation)], rank
        assert out["backward"] == [("all_reduce", tp_ranks, activation)], rank
        assert out["witness"] == 1, rank
