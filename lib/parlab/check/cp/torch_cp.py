r"""Exercise 7 of module 05, `check_context_parallel(cp_attention, ring_attention)`: PyTorch's
`context_parallel` around non-causal SDPA.

`cp_attention(q, k, v, dout, mesh)` gets the whole sequence, q, k, v and the output
gradient dout (B, H, T, D), the same on every rank of a CP group, and a DeviceMesh: 1-D
("cp",) on `world_size` ranks, or (dp, cp) with `mesh=(dp, cp)`, whose dp replicas hold
different sequences. It must return (out, dq, dk, dv), (B, H, T, D) each in position order,
computed by SDPA under `context_parallel` over mesh['cp'], forward and backward, with load
balancing off (non-causal: on CUDA the ring raises RuntimeError with it on), and raise
ValueError when T is not a multiple of the CP group's size. T = 6 W_cp (T = 6 W_cp + 1 for the
ValueError), B = 1, H = 2, D = 8, float64 on a CPU (float32 on GPUs), against softmax
attention on one device written out in float64 (`common.reference`, autograd for the
gradients). What the ranks watch is in `torch_cp_ranks`; here, per rank and in this order:
the answer's error or ValueError, one SDPA call on DTensors over this rank's CP group, the
four results' shapes, their values (a wrong one compared with the load-balanced order),
load balancing off, and on a CPU the backward's reduce-scatters of dK and dV. With
`ring_attention` (exercise 2) on a 1-D mesh, the learner's ring then runs on the same tokens,
in a run of its own, and the check prints both outputs' agreement and their forward bytes
beside each other; the ring never decides this check (an error or a hang is reported).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab import launch
from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, not_reexport, run_checked
from parlab.check.cp.common import reference
from parlab.check.cp.torch_cp_ranks import B, D, H, N, inputs, ring_worker, worker
from parlab.cp import torch_cp
from parlab.cp.compare import allgather_bytes_per_layer

__all__ = ["check_context_parallel", "SEEDS"]

SEEDS = (707, 708)  # the even case (plus 100 per CP group's first rank), the uneven one
TOL = {"float64": (1e-10, 1e-12), "float32": (1e-5, 1e-6)}  # rtol, atol by the ranks' dtype
HANG = ("every rank of a CP group must enter context_parallel with the same mesh and the "
        "same buffers, and run SDPA, its backward and the unshard the same number of times")
NOT_PATCHED = ("context_parallel replaces the attribute F.scaled_dot_product_attention while "
               "its block is open: call it as F.scaled_dot_product_attention(...) (torch.nn."
               "functional's attribute) inside the block. A name imported before "
               "(from torch.nn.functional import scaled_dot_product_attention) is the "
               "unpatched function, which attends to this rank's own piece only")
MESH = ("pass mesh['cp'] to context_parallel (and to context_parallel_unshard): the mesh "
        "you are given has a dp dimension too, whose replicas hold other sequences; a mesh "
        "of your own over every rank, or mesh['dp'], mixes their keys into your attention")
GATHER = ("return the whole sequence: context_parallel_unshard(mesh['cp'], [out, q.grad, "
          "k.grad, v.grad], [2, 2, 2, 2]) all-gathers this rank's pieces in position order")
ORDER = ("the tokens come back in context_parallel's load-balanced order (rank r holds "
         "chunks r and 2W - 1 - r of 2W; a plain all-gather puts them in rank order): gather "
         "with context_parallel_unshard, which puts the positions back, and for attention "
         "without a causal mask turn load balancing off, which makes every piece contiguous")
RESTORED = ("context_parallel_unshard reorders with the load-balancing setting in force when "
            "it is called (it reads _cp_options then, not how the pieces were cut): the pieces "
            "were cut contiguous and unsharded as if load-balanced. Unshard inside the "
            "context_parallel block, or before putting the earlier setting back")
BALANCE = ("load balancing was on (PyTorch's default, _cp_options.enable_load_balance) for "
           "attention without a causal mask: on CUDA context_parallel's ring raises "
           "RuntimeError('Load balancing requires `is_causal=True`.'). Set "
           "_cp_options.enable_load_balance = False inside your function, before "
           "context_parallel (a line at the top of a notebook cell runs in the kernel, not "
           "in the ranks)")
BACKWARD = ("dq, dk and dv must come from the backward of the SDPA that ran under "
            "context_parallel: out.backward(dout's piece) inside the block, then unshard the "
            "pieces' .grad")


def _reference(seed: int, seq_len: int) -> list[Tensor]:
    """out, dq, dk, dv of non-causal softmax attention on one device, float64."""
    q, k, v, dout = inputs(seed, seq_len, torch.float64)
    lq, lk, lv = leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    every = torch.arange(seq_len)
    out, _ = reference(lq, lk, lv, every, every, causal=False)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves if x.grad is not None]


def _judge(res: dict, rank: int, ref: list[Tensor], dtype: str) -> None:
    """The even case of one rank, against the one-device reference `ref`."""
    calls, group = res["calls"], res["group"]
    seq = ref[0].shape[2]
    if not calls:
        fail("no call of F.scaled_dot_product_attention was seen while cp_attention ran",
             rank=rank, hint=NOT_PATCHED)
    for call in calls:
        if sorted(call["mesh"]) != sorted(group):
            fail(f"context_parallel ran over the ranks {call['mesh']}; this rank's sequence "
                 f"is held by its CP group, ranks {group}", rank=rank, hint=MESH)
    got = res.get("result") or []
    if len(got) != 4 or not all(isinstance(x, Tensor) for x in got):
        fail(f"cp_attention returned {[getattr(x, 'shape', x) for x in got]}, expected four "
             f"tensors (out, dq, dk, dv) of shape {(B, H, seq, D)}", rank=rank,
             hint="return out, q.grad, k.grad, v.grad, each gathered: " + GATHER)
    rtol, atol = TOL[dtype]
    for name, x, want in zip(("out", "dq", "dk", "dv"), got, ref, strict=True):
        if tuple(x.shape) == (B, H, seq // len(group), D):
            fail(f"{name} has shape {tuple(x.shape)}, this rank's piece; expected the whole "
                 f"sequence {(B, H, seq, D)}", rank=rank, hint=GATHER)
        assert_close(x, want.to(getattr(torch, dtype)), name=f"cp_attention's {name}",
                     rank=rank, rtol=rtol, atol=atol,
                     hint=_story(x, want, len(group), rtol, atol))
    if any(call["load_balance"] for call in calls):
        held = calls[0].get("positions")
        fail(f"SDPA ran with load balancing on; rank {rank}'s piece held positions {held}",
             rank=rank, hint=BALANCE)
    kinds = [kind for kind, _, _ in res["functional"]]
    if res["device"] == "cpu" and kinds.count("reduce_scatter_tensor") < 2:
        fail("the backward of context_parallel's SDPA did not run: no reduce-scatter of dK "
             "and dV was seen", rank=rank, hint=BACKWARD)


def _story(got: Tensor, want: Tensor, world_cp: int, rtol: float, atol: float) -> str | None:
    """ORDER when `got` is `want` in the head-tail (load-balanced) order, as a plain
    all-gather of balanced pieces returns it; RESTORED when it is contiguous pieces put
    through the head-tail restore; else None."""
    seq = want.shape[2]
    if got.shape != want.shape or seq % (2 * world_cp):
        return None
    m = seq // (2 * world_cp)
    order = torch.cat([torch.cat([torch.arange(r * m, (r + 1) * m),
                                  torch.arange((2 * world_cp - 1 - r) * m,
                                               (2 * world_cp - r) * m)])
                       for r in range(world_cp)])  # rank order of the balanced pieces
    for hint, index in ((ORDER, order), (RESTORED, torch.argsort(order))):
        if torch.allclose(got, want[..., index, :].to(got.dtype), rtol=rtol, atol=atol):
            return hint
    return None


def _judge_uneven(res: dict, rank: int, seq_len: int) -> None:
    if "refused" not in res:
        fail(f"cp_attention returned on T = {seq_len} tokens, which {len(res['group'])} CP "
             "ranks cannot share equally; the check expected ValueError", rank=rank,
             hint="raise ValueError when mesh['cp'].size() does not divide q.shape[2]: "
             "context_parallel cannot pad, and its all-gather mismatches on uneven pieces")


RING_S = 10.0  # the learner's ring, run for the printed comparison only


def _ring_line(ring: Callable, world: int, cp_out: Tensor) -> str:
    """What the learner's ring gives beside context_parallel's output, in a run of its own
    whose failure (an error, a hang) is reported, never raised."""
    try:
        rings = launch.run(ring_worker, world, ring, SEEDS[0], timeout=RING_S)
    except Exception as exc:  # noqa: BLE001 - exercise 2's own check says what is wrong
        first = str(exc).strip().splitlines()[0][:160]
        return f"Your ring_attention (exercise 2) was not compared: {type(exc).__name__}: {first}"
    ring_out = torch.cat([r["out"] for r in rings], dim=2)  # contiguous: rank order
    diff = float((ring_out.double() - cp_out.double()).abs().max())
    sent = sum(w for _, _, w in rings[0]["sent"])
    calls = len([k for k, _, _ in rings[0]["sent"] if k in ("send", "isend")])
    return (f"Your ring_attention (exercise 2) on the same tokens: largest difference from "
            f"context_parallel's output {diff:.1e}; its forward sent {sent:,.0f} B from rank 0 "
            f"in {calls} sends.")


@exercise("05.context_parallel")
def check_context_parallel(cp_attention: Callable, ring_attention: Callable | None = None, *,
                           world_size: int = 3, mesh: tuple[int, int] | None = None,
                           timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 7 (module docstring): on `world_size` ranks, a 1-D ("cp",) mesh, or a
    ("dp", "cp") mesh of shape `mesh`."""
    not_reexport(cp_attention, name="cp_attention")
    torch_cp.share_cp_options()  # PyTorch's _cp_options reach the ranks as theirs, not a copy
    shape = tuple(mesh) if mesh is not None else (world_size,)
    if len(shape) not in (1, 2) or torch.Size(shape).numel() != world_size:
        raise ValueError(f"mesh={mesh} does not fit {world_size} ranks as (dp, cp)")
    names = ("dp", "cp") if len(shape) == 2 else ("cp",)
    results = run_checked(worker, world_size, cp_attention, shape, names, SEEDS,
                          what="context_parallel attention", timeout=timeout, hang_hint=HANG)
    world_cp = shape[-1]
    for rank, res in enumerate(results):
        _judge_uneven(res["uneven"], rank, N * world_cp + 1)
    for rank, res in enumerate(results):
        even = res["even"]
        seed = SEEDS[0] + 100 * min(even["group"])
        _judge(even, rank, _reference(seed, N * world_cp), res["dtype"])
    if quiet:
        return
    first = results[0]["even"]
    span = first["calls"][0]["events"]
    forward = first["functional"][span[0]:span[1]]
    fwd_bytes = sum(w for _, _, w in forward)
    after = sum(w for _, _, w in first["functional"][span[1]:]) + sum(
        w for _, _, w in first["traced"])
    kinds = ", ".join(sorted({k.replace("_into_tensor", "").replace("_tensor", "")
                              for k, _, _ in first["functional"]}))
    model = allgather_bytes_per_layer(B, N * world_cp, H * D, world_cp,
                                      first["result"][0].element_size())
    how = ("On this CPU it ran no ring but DTensor's " + kinds + ". Forward, rank 0 sent "
           f"{fwd_bytes:,.0f} B in {len(forward)} collectives (K and V all-gathered: (W - 1)/W "
           f"of 2 B T H D d = {model:,.0f} B)" if first["device"] == "cpu" else
           f"On the GPUs it ran PyTorch's ring ({kinds}); forward, rank 0 sent "
           f"{fwd_bytes:,.0f} B in {len(forward)} collectives")
    print(f"context_parallel OK on {world_size} ranks (T = {N * world_cp}; T = "
          f"{N * world_cp + 1} refused with ValueError): out, dq, dk, dv equal attention on "
          f"one device. {how}; the backward and the unshard {after:,.0f} B more.")
    if ring_attention is not None and len(shape) == 1:
        print(_ring_line(ring_attention, world_size, first["result"][0]))
