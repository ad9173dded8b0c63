r"""Graded checks of module 06, exercises 3 and 4: expert-parallel dispatch and combine.

Ranks run on gloo with CPU tensors, also on a GPU machine (the sizes are tiny).
Setup (float64, tolerance rtol 1e-10): a `parlab.moe.MoE` with E = 2t experts (2 per rank,
block placement), hidden C = 8, FFN 12, k = 2, seeded; N = 6 tokens per rank whose first
feature is 1 and a router that favours expert 0 through it (a skewed load). The routing
(gates, experts) comes from `parlab.moe.route` and is handed to the learner's function with
this rank's `ExpertShard`; the loss is sum(y * u) for a seeded u.
Compared with `parlab.moe.moe_reference` on one device (a loop over tokens, with the
capacity applied per rank's group of N tokens in exercise 4): y, and the gradients of x,
of the gates and of this rank's expert weights.

In the ranks, `dist.all_to_all_single` is watched: in exercise 3 every call moving token rows
must use the split sizes the routing implies (what this rank sends to each rank, and what each
rank sends to it), so a missing count exchange or a wrong placement is named before gloo aborts
on mismatched sizes; in exercise 4 both forward all-to-alls must carry the static (E c, C)
buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, assert_close, fail, not_reexport, run_checked
from parlab.check.moe import F64_TOL, _story, blocked_reference

__all__ = ["check_ep_moe", "check_ep_capacity", "CheckFailed"]
N, C, FFN, K, SKEW, SEED = 6, 8, 12, 2, 3.0, 2024
CAPACITY_FACTOR = 1.0
NOT_EXCHANGED = ("the split sizes were not exchanged: this rank used its own send sizes as "
                 "the sizes it receives. First all_to_all_single the per-expert counts (an "
                 "(E,) integer tensor, equal splits), then sum what each rank sends you")
PLACEMENT = ("experts are placed in blocks: global expert e lives on rank e // (E / t) as "
             "local expert e % (E / t), not on rank e % t")
GATES = ("the expert outputs were combined without the gate weights: y_i = x_i + sum_j "
         "g_ij * FFN_e_ij(x_i), multiply each returned row by its gate before summing")
RESIDUAL = ("a token dropped by every expert it chose must leave the layer unchanged: "
            "y_i = x_i through the residual, never zero")
NO_DROPS = ("every assignment reached its expert: apply keep_mask with the capacity; "
            "dropped ones add nothing")
STATIC = ("with a capacity the buffers have static sizes: send exactly c slots per expert, "
          "an (E * c, C) tensor padded with zeros, with equal splits")


HANG = ("a collective that only some ranks call, or split sizes that do not match between "
        "ranks: every rank must make the same calls in the same order")
# gloo: CPU tensors, tiny sizes, even on a GPU machine
_run = functools.partial(run_checked, hang_hint=HANG, backend="gloo")


def _setup(t: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from parlab.moe.layer import MoE, route

    torch.manual_seed(SEED)
    layer = MoE(C, FFN, 2 * t, k=K).double()
    with torch.no_grad():
        layer.router[0, 0] = SKEW
    x = torch.randn(N * t, C, dtype=torch.float64)
    x[:, 0] = 1.0
    up = torch.randn(N * t, C, dtype=torch.float64)
    gates, experts, _ = route(x, layer.router.detach(), k=K)
    return layer, x, up, gates, experts


def _splits(experts: torch.Tensor, rank: int, t: int, owner: Callable) -> tuple[list, list]:
    """(send, recv): rows this rank sends to each rank; rows each rank sends to this rank."""
    dest = owner(experts)  # (N t, k)
    send = torch.bincount(dest[rank * N:(rank + 1) * N].flatten(), minlength=t).tolist()
    recv = [int((dest[q * N:(q + 1) * N] == rank).sum()) for q in range(t)]
    return send, recv


def _watch(rank: int, t: int, experts: torch.Tensor) -> None:
    import torch.distributed as dist

    from parlab import comm

    comm.install()
    original = dist.all_to_all_single
    e = 2 * t
    send, recv = _splits(experts, rank, t, lambda x: x // (e // t))
    rr_send, rr_recv = _splits(experts, rank, t, lambda x: x % t)  # round-robin placement

    def watched(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                async_op=False):
        if input.is_floating_point() and input.dim() == 2 and output_split_sizes is not None:
            out_s = [int(s) for s in output_split_sizes]
            in_s = [int(s) for s in (input_split_sizes or [])]
            if (out_s, in_s) not in ((recv, send), (send, recv)):
                rr = (out_s, in_s) in ((rr_recv, rr_send), (rr_send, rr_recv))
                hint = (PLACEMENT if rr else NOT_EXCHANGED
                        if out_s == in_s else "the sizes it sends and receives come from "
                        "the routing: exchange the counts first")
                raise CheckFailed(
                    f"rank {rank}: all_to_all_single(output_split_sizes={out_s}, "
                    f"input_split_sizes={in_s}) does not fit the routing: this rank sends "
                    f"{send} rows to ranks 0..{t - 1} and receives {recv}\nLikely mistake: "
                    + hint)
        return original(output, input, output_split_sizes, input_split_sizes, group=group,
                        async_op=async_op)

    dist.all_to_all_single = watched


def _ep_worker(fn: Callable, capacity_factor: float | None) -> dict:
    import torch.distributed as dist

    from parlab import comm
    from parlab.moe.dispatch import ExpertShard
    from parlab.moe.layer import expert_capacity

    rank, t = dist.get_rank(), dist.get_world_size()
    layer, x, up, gates, experts = _setup(t)
    rows = slice(rank * N, (rank + 1) * N)
    shard = ExpertShard(layer, rank, t)
    xs = x[rows].clone().requires_grad_()
    gs = gates.detach()[rows].clone().requires_grad_()
    args: list[Any] = [xs, gs, experts[rows].clone(), shard]
    if capacity_factor is None:
        _watch(rank, t, experts)
        what = "ep_moe(x, gates, experts, shard)"
    else:
        args.append(expert_capacity(N, num_experts=2 * t, k=K, capacity_factor=capacity_factor))
        what = "ep_moe_capacity(x, gates, experts, shard, capacity)"
    with blocked_reference(), comm.trace() as tr:
        try:
            y = fn(*args)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            fail(f"{what} raised {type(exc).__name__}: {exc}", rank=rank,
                 hint="read the error above; shapes: x (N, C), gates and experts (N, k)")
    if not isinstance(y, torch.Tensor) or y.shape != xs.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        fail(f"{what} returned {got}, expected a tensor of shape {tuple(xs.shape)}", rank=rank,
             hint="return this rank's tokens after the layer: (N, C)")
    if not y.requires_grad:
        fail(f"{what} returned a tensor with no autograd graph", rank=rank,
             hint="the all-to-all must be differentiable: an autograd Function whose backward "
                  "is the all-to-all with the split sizes swapped")
    fwd = [(e.kind, tuple(e.shape), e.wire_bytes) for e in tr.events]
    with blocked_reference():
        (y * up[rows]).sum().backward()
    grads = [None if p.grad is None else p.grad.detach() for p in (xs, gs, shard.w1, shard.w2)]
    return {"y": y.detach(), "grads": grads, "forward": fwd}


def _reference(t: int, capacity_factor: float | None, *, gates_one: bool = False,
               perm: Callable[[int], int] | None = None) -> dict:
    from parlab.moe.layer import moe_reference

    layer, x, up, gates, experts = _setup(t)
    xr, gr = x.clone().requires_grad_(), gates.detach().clone().requires_grad_()
    g = torch.ones_like(gr) if gates_one else gr
    expert = layer.expert if perm is None else (lambda e, h: layer.expert(perm(e), h))
    y = moe_reference(xr, g, experts, expert, num_experts=2 * t,
                      capacity_factor=capacity_factor, groups=t)
    if gates_one or perm is not None:
        return {"y": y.detach()}
    (y * up).sum().backward()
    return {"y": y.detach(), "x": x, "experts": experts,
            "grads": [xr.grad, gr.grad, layer.w1.grad, layer.w2.grad]}


def _compare(results: list, t: int, capacity_factor: float | None, what: str) -> None:
    from parlab.moe.layer import keep_mask

    ref = _reference(t, capacity_factor)
    wrong = [(_reference(t, capacity_factor, gates_one=True)["y"], GATES),
             (_reference(t, capacity_factor, perm=lambda e: (e % t) * 2 + e // t)["y"],
              PLACEMENT)]
    if capacity_factor is not None:
        wrong.append((_reference(t, None)["y"], NO_DROPS))
    for rank, res in enumerate(results):
        rows = slice(rank * N, (rank + 1) * N)
        y = res["y"]
        if capacity_factor is not None:
            cap = -(-int(capacity_factor * N * K) // (2 * t))
            keep = keep_mask(ref["experts"][rows], num_experts=2 * t, capacity=cap)
            lost = ~keep.any(dim=1)
            if bool(lost.any()) and not torch.allclose(y[lost], ref["x"][rows][lost]):
                fail(f"{what}: the {int(lost.sum())} tokens dropped by all their experts "
                     "differ from their input", rank=rank, hint=RESIDUAL)
        assert_close(y, ref["y"][rows], name=f"{what}: y", rank=rank, **F64_TOL,
                     hint=_story(y, [(w[rows], h) for w, h in wrong]))
        names = ("x", "the gates", "this rank's w1", "this rank's w2")
        for name, got, want in zip(names, res["grads"], ref["grads"], strict=True):
            part = want[rows] if name in ("x", "the gates") else want[2 * rank:2 * rank + 2]
            assert_close(got, part, name=f"{what}: grad of sum(y * u) w.r.t. {name}",
                         rank=rank, **F64_TOL,
                         hint="the backward of an all-to-all is the all-to-all with the split "
                              "sizes swapped; let autograd see every step")


def _floats(events: list) -> list:
    return [e for e in events if e[0] == "all_to_all_single" and len(e[1]) == 2
            and e[1][1] == C]


def check_ep_moe(ep_moe: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                 quiet: bool = False) -> None:
    """ep_moe(x, gates, experts, shard) on t ranks against the single-device MoE."""
    not_reexport(ep_moe, name="ep_moe")
    t = world_size
    results = _run(_ep_worker, t, ep_moe, None, what="ep_moe", timeout=timeout)
    _compare(results, t, None, "ep_moe")
    for rank, res in enumerate(results):
        if len(_floats(res["forward"])) != 2:
            fail(f"the forward made {len(_floats(res['forward']))} all-to-alls of token rows, "
                 "expected 2 (dispatch, then combine)", rank=rank,
                 hint="send every token copy in one all_to_all_single and bring the results "
                      "back in one")
    if not quiet:
        print(f"ep_moe OK on {t} ranks ({2 * t} experts, 2 per rank): output and gradients "
              "match the single-device MoE; the split sizes fit the routing")


def check_ep_capacity(ep_moe_capacity: Callable, *, world_size: int = 2,
                      capacity_factor: float = CAPACITY_FACTOR, timeout: float = CHECK_TIMEOUT_S,
                      quiet: bool = False) -> dict:
    """ep_moe_capacity(x, gates, experts, shard, capacity) against the single-device MoE with
    the same drops; returns the forward all-to-all bytes of rank 0, measured and modelled."""
    from parlab.moe.costs import ep_a2a_bytes
    from parlab.moe.layer import expert_capacity

    not_reexport(ep_moe_capacity, name="ep_moe_capacity")
    t = world_size
    results = _run(_ep_worker, t, ep_moe_capacity, capacity_factor, what="ep_moe_capacity",
                   timeout=timeout)
    _compare(results, t, capacity_factor, "ep_moe_capacity")
    c = expert_capacity(N, num_experts=2 * t, k=K, capacity_factor=capacity_factor)
    for rank, res in enumerate(results):
        shapes = [s for _, s, _ in _floats(res["forward"])]
        if shapes != [(2 * t * c, C)] * 2:
            fail(f"the forward's all-to-alls of token rows had shapes {shapes}; expected two of "
                 f"({2 * t} * {c}, {C}) = {(2 * t * c, C)}", rank=rank, hint=STATIC)
    measured = sum(b for _, _, b in _floats(results[0]["forward"]))
    model = ep_a2a_bytes(N, C, t, num_experts=2 * t, k=K, capacity_factor=capacity_factor,
                         dtype_bytes=8)
    if not quiet:
        print(f"ep_moe_capacity OK on {t} ranks (capacity {c} per expert and rank): output and "
              f"gradients match the single-device MoE with the same drops; static buffers")
    return {"measured": measured, "model": model, "capacity": c, "t": t, "n_tokens": N,
            "hidden": C, "k": K, "num_experts": 2 * t, "capacity_factor": capacity_factor}

