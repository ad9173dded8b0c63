"""parlab.cp.torch_cp, the course's bridge to PyTorch's context_parallel (torch 2.13, CPU):
its load-balanced layout against the zigzag layout written out here, DTensor's functional
collectives seen by the dispatch mode as by parlab.comm's wrapper, and
context_parallel_attention's results, phases and bytes against one device and the closed
forms of parlab.cp.compare."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab import comm
from parlab.check.cp.torch_cp_ranks import SdpaWatch
from parlab.cp import allgather_bytes_per_layer, torch_cp
from parlab.launch import run


@pytest.mark.parametrize("world,seq_len", [(2, 8), (3, 12), (4, 16), (3, 24)])
def test_head_tail_is_the_zigzag_layout(world: int, seq_len: int) -> None:
    m = seq_len // (2 * world)  # rank r: chunks r and 2W - 1 - r of m tokens
    want = torch.stack([torch.cat([torch.arange(r * m, (r + 1) * m),
                                   torch.arange((2 * world - 1 - r) * m, (2 * world - r) * m)])
                        for r in range(world)])
    assert torch.equal(torch_cp.head_tail_table(world, seq_len), want)
    assert torch_cp.load_balanced(world, seq_len) and not torch_cp.load_balanced(world, seq_len
                                                                                 + world)


def test_head_tail_needs_2w_to_divide_t() -> None:
    with pytest.raises(ValueError, match="divisible by 2W = 6"):
        torch_cp.head_tail_table(3, 15)


def test_the_watch_puts_sdpa_back() -> None:
    original = F.scaled_dot_product_attention
    with pytest.raises(RuntimeError), SdpaWatch(torch.zeros(1, 2, 4, 8), 2, comm.Trace()):
        assert F.scaled_dot_product_attention is not original
        raise RuntimeError("the learner's code failed")
    assert F.scaled_dot_product_attention is original


def _ranks(seq_len: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    x = torch.arange(4.0 * world).view(world, 4)  # 16 B a row
    with torch_cp.functional_trace() as seen, comm.trace() as traced:
        whole = distribute_tensor(x, mesh, [Shard(0)]).full_tensor()
    gathered = {"equal": bool(torch.equal(whole, x)), "traced": traced.count(),
                "seen": [(e.kind, e.nbytes, e.wire_bytes, e.group_ranks) for e in seen.events]}
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(1, 2, seq_len, 8, generator=gen, dtype=torch.float64)
                     for _ in range(4))
    kept = [t.clone() for t in (q, k, v, dout)]
    phases: dict = {}
    got = torch_cp.context_parallel_attention(q, k, v, dout, mesh, phases=phases)
    unchanged = all(torch.equal(a, b) for a, b in zip(kept, (q, k, v, dout), strict=True))
    calls = {name: [(e.kind, e.wire_bytes) for e in p.events] for name, p in phases.items()}
    try:
        torch_cp.context_parallel_attention(q, k, v, dout, mesh, causal=True)
        causal = "ran"
    except Exception as exc:  # noqa: BLE001 - what PyTorch says on a CPU is the result
        causal = type(exc).__name__
    try:
        torch_cp.context_parallel_attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1],
                                            dout[:, :, :-1], mesh)
        uneven = "ran"
    except ValueError as exc:
        uneven = str(exc)
    return {"gathered": gathered, "got": got, "phases": calls, "unchanged": unchanged,
            "causal": causal, "uneven": uneven, "inputs": kept,
            "pieces": [_piece(mesh, heads, tokens, dim) for heads, tokens, dim in PIECES]}


PIECES = [(2, 6, 8), (8, 6, 64)]  # (H, tokens per rank, D) of one SDPA call on 3 ranks


def _piece(mesh, heads: int, tokens: int, head_dim: int) -> tuple[int, ...]:
    """The shape of what context_parallel's SDPA hands back, load balancing off."""
    from torch.distributed.tensor.experimental import _attention, context_parallel

    _attention._cp_options.enable_load_balance = False
    world = mesh.size()
    pieces = [torch.randn(1, heads, tokens * world, head_dim) for _ in range(3)]
    with torch_cp.cp_sdpa("cpu"), context_parallel(mesh, buffers=pieces, buffer_seq_dims=[2] * 3,
                                                   no_restore_buffers=set(pieces)):
        return tuple(F.scaled_dot_product_attention(*pieces).shape)


def _attention(q, k, v, dout):  # one device, float64, the softmax written out
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch.softmax(leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(q.shape[-1]),
                        dim=-1) @ leaves[2]
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves]


def test_context_parallel_on_cpu_ranks() -> None:
    world, seq_len = 3, 12  # 2W divides T: load balancing would reorder, it must stay off
    results = run(_ranks, world, seq_len, timeout=60)
    for rank, res in enumerate(results):
        g = res["gathered"]  # the dispatch mode and parlab.comm's funcol wrapper see one call
        assert g["equal"] and g["traced"] == 1, g
        assert g["seen"] == [("all_gather_into_tensor", 16 * world, 16 * (world - 1),
                              tuple(range(world)))], g["seen"]
        want = _attention(*res["inputs"])
        for name, x, w in zip(("out", "dq", "dk", "dv"), res["got"], want, strict=True):
            assert torch.allclose(x, w, rtol=1e-10, atol=1e-12), (rank, name)
        assert res["unchanged"], "the caller's q, k, v, dout were cut in place"
        kinds = {name: [k for k, _ in calls] for name, calls in res["phases"].items()}
        assert kinds == {"forward": ["all_gather_into_tensor"] * 2,
                         "backward": ["all_gather_into_tensor"] * 2
                         + ["reduce_scatter_tensor"] * 2,
                         "unshard": ["all_gather_into_tensor"] * 4}, kinds
        sent = sum(w for name in ("forward", "backward") for _, w in res["phases"][name])
        assert sent == allgather_bytes_per_layer(1, seq_len, 2 * 8, world, 8, backward=True,
                                                 regather=True)
        assert res["causal"] == "RuntimeError"  # the math backend's mask meets DTensors
        assert "T must be a multiple of the CP group's size" in res["uneven"], res["uneven"]
        # torch 2.13 on a CPU: DTensor picks its own placement for the math backend's output,
        # and context_parallel's wrapper hands back its local tensor as this rank's piece: a
        # piece of (1, 2, 6, 8) for 2 heads of 8, but for 8 heads of 64 the output stays
        # replicated and every rank gets the whole sequence (1, 8, 18, 64). Module 05's
        # section 10 says so; when this fails, PyTorch changed: rewrite that paragraph.
        assert res["pieces"] == [(1, 2, 6, 8), (1, 8, 18, 64)], res["pieces"]
