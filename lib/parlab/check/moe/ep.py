r"""Graded checks of module 06, exercises 3 and 4: expert-parallel dispatch and combine.

Ranks run on gloo with CPU tensors, also on a GPU machine (the sizes are tiny). `ep` is the
expert-parallel degree, the number of ranks. Setup (float64, tolerance rtol 1e-10): a
`parlab.moe.MoE` with E = experts_per_rank · ep experts (block placement), hidden C = 8, FFN
12, each token routed to `top_k` experts, every parameter randomised; N = 6 tokens per rank
whose first feature is 1 and a router that favours expert 0 through it (a skewed load). The
routing (gates, experts) comes from `parlab.moe.route` and is handed to the learner's function
with this rank's `ExpertShard`; the loss is sum(y * u) for a seeded u. Compared with
`parlab.moe.moe_reference` on one device (a loop over tokens, with the capacity applied per
rank's group of N tokens in exercise 4): y, and the gradients of x, of the gates and of this
rank's expert weights; `experts` must come back unchanged.

Every `dist.all_to_all_single` is watched (`parlab.check.moe.watch`): receive dtypes, and in
exercise 3 the split sizes the routing implies; in exercise 4 both forward all-to-alls of
token rows must carry the static (E c, C) buffer. A call with another number of experts per
rank or another k than 2 also runs 2 and 2 first, in the same launch (`ep_hints.configs`), so
that a failure of the asked configuration alone names what the answer depends on.

A right answer does not depend on, and the tests vary: the EP degree (visible 2 and 3 ranks,
hidden 4), the experts per rank (visible 2 and 3, hidden 1), k (visible 2 and 3 for exercise
3, 2 and 1 for exercise 4; hidden 1 and 2), the capacity and whether it is whole (factors 1.0
and 1.25: 12 · 1.25 / 9 slots), the uneven splits (a skewed router: ranks send and receive
different numbers of rows), the upstream gradient (random, never 1: the AllToAll Function's
backward is checked through it). Fixed: N = 6 tokens on every rank, C = 8, float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import parlab.check._harness as harness
from parlab.check._compare import assert_close, assert_unchanged, fail, randomize_parameters
from parlab.check.moe import ep_hints as h
from parlab.check.moe import watch
from parlab.check.moe.common import F64_TOL, KEYS, REFUSAL, references, story

__all__ = ["check_ep_moe", "check_ep_capacity"]
N, C, FFN, SKEW, SEED = 6, 8, 12, 3.0, 1  # seed 1: some tokens lose every expert
CAPACITY_FACTOR = 1.0
# gloo: CPU tensors, tiny sizes, even on a GPU machine
_run = functools.partial(harness.run_checked, hang_hint=h.HANG, backend="gloo")


def _setup(ep: int, per_rank: int, top_k: int) -> tuple[Any, torch.Tensor, torch.Tensor,
                                                         torch.Tensor, torch.Tensor]:
    from parlab.moe.layer import MoE, route

    torch.manual_seed(SEED)
    layer = MoE(C, FFN, per_rank * ep, k=top_k).double()
    randomize_parameters(layer, seed=SEED)
    with torch.no_grad():
        layer.router[0, 0] = SKEW
    x = torch.randn(N * ep, C, dtype=torch.float64)
    x[:, 0] = 1.0
    up = torch.randn(N * ep, C, dtype=torch.float64)
    gates, experts, _ = route(x, layer.router.detach(), k=top_k)
    return layer, x, up, gates, experts


def _inputs(rank: int, ep: int, per_rank: int, capacity_factor: float | None,
            top_k: int) -> dict:
    """One configuration's inputs in a rank, made before parlab.moe is refused there."""
    from parlab.moe.dispatch import ExpertShard
    from parlab.moe.layer import expert_capacity

    layer, x, up, gates, experts = _setup(ep, per_rank, top_k)
    rows = slice(rank * N, (rank + 1) * N)
    xs = x[rows].clone().requires_grad_()
    gs = gates.detach()[rows].clone().requires_grad_()
    args: list[Any] = [xs, gs, experts[rows].clone(), ExpertShard(layer, rank, ep)]
    if capacity_factor is None:
        what = "ep_moe(x, gates, experts, shard)"
        expected = {"blocks": watch.splits_of(experts, rank, ep, N, lambda e: e // per_rank),
                    "round_robin": watch.splits_of(experts, rank, ep, N, lambda e: e % ep)}
    else:
        what, expected = "ep_moe_capacity(x, gates, experts, shard, capacity)", None
        args.append(expert_capacity(N, num_experts=per_rank * ep, k=top_k,
                                    capacity_factor=capacity_factor))
    return {"args": args, "what": what, "expected": expected, "experts": experts[rows],
            "up": up[rows], "where": _where(ep, per_rank, top_k)}


def _ep_one(fn: Callable, rank: int, ep: int, run: dict, crash_hint: str | None) -> dict:
    """One configuration in a rank: the learner's function forward and backward, traced."""
    from parlab import comm

    args, what = run["args"], run["what"]
    xs, gs, es, shard = args[:4]
    watch.install(rank, ep, run["expected"])
    with comm.trace() as tr:
        y = harness.call_learner(f"{what} on {run['where']}", fn, *args, hint=crash_hint,
                                 shape_hint=h.SHAPES)
    assert_unchanged(run["experts"], es, name="experts", rank=rank)
    if not isinstance(y, torch.Tensor) or y.shape != xs.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        fail(f"{what} returned {got}, expected a tensor of shape {tuple(xs.shape)}", rank=rank,
             hint=crash_hint or "return this rank's tokens after the layer: (N, C)")
    if not y.requires_grad:
        fail(f"{what} returned a tensor with no autograd graph", rank=rank,
             hint="the all-to-all must be differentiable: an autograd Function whose backward "
                  "is the all-to-all with the split sizes swapped")
    fwd = [(e.kind, tuple(e.shape), e.wire_bytes) for e in tr.events]
    harness.call_learner(f"the backward of {what}", lambda: (y * run["up"]).sum().backward(),
                         hint=crash_hint)
    grads = [None if p.grad is None else p.grad.detach() for p in (xs, gs, shard.w1, shard.w2)]
    return {"y": y.detach(), "grads": grads, "forward": fwd}


def _ep_worker(fn: Callable, per_rank: int, capacity_factor: float | None,
               top_k: int) -> list[dict]:
    """Every configuration of `ep_hints.configs`, the base first: a crash of the asked one
    after the base ran gets the hint that names what differs."""
    import torch.distributed as dist

    rank, ep = dist.get_rank(), dist.get_world_size()
    runs = h.configs(per_rank, top_k)
    inputs = [_inputs(rank, ep, p, capacity_factor, k) for p, k in runs]
    harness.refuse_in_rank(references(), REFUSAL)
    return [_ep_one(fn, rank, ep, run, h.varied(p, k, crashed=True) if i else None)
            for i, ((p, k), run) in enumerate(zip(runs, inputs, strict=True))]


def _reference(ep: int, per_rank: int, capacity_factor: float | None, top_k: int, *,
               gates_one: bool = False, perm: Callable[[int], int] | None = None) -> dict:
    from parlab.moe.layer import moe_reference

    layer, x, up, gates, experts = _setup(ep, per_rank, top_k)
    xr, gr = x.clone().requires_grad_(), gates.detach().clone().requires_grad_()
    g = torch.ones_like(gr) if gates_one else gr
    expert = layer.expert if perm is None else (lambda e, h: layer.expert(perm(e), h))
    y = moe_reference(xr, g, experts, expert, num_experts=per_rank * ep,
                      capacity_factor=capacity_factor, groups=ep)
    if gates_one or perm is not None:
        return {"y": y.detach()}
    (y * up).sum().backward()
    return {"y": y.detach(), "x": x, "experts": experts,
            "grads": [xr.grad, gr.grad, layer.w1.grad, layer.w2.grad]}


def _wrong(ep: int, per_rank: int, capacity_factor: float | None, top_k: int) -> list:
    """Outputs of known mistakes, each with its hint."""
    wrong = [(_reference(ep, per_rank, capacity_factor, top_k, gates_one=True)["y"], h.GATES),
             (_reference(ep, per_rank, capacity_factor, top_k,
                         perm=lambda e: (e % ep) * per_rank + e // ep)["y"], watch.PLACEMENT)]
    if capacity_factor is not None:
        wrong.append((_reference(ep, per_rank, None, top_k)["y"], h.NO_DROPS))
    return wrong


def _compare(results: list, ep: int, per_rank: int, capacity_factor: float | None, top_k: int,
             what: str, fallback: str) -> None:
    """One configuration's results against the single device; `fallback`: the likely mistake
    of a wrong y that no known mistake reproduces."""
    from parlab.moe.layer import expert_capacity, keep_mask

    ref = _reference(ep, per_rank, capacity_factor, top_k)
    wrong = _wrong(ep, per_rank, capacity_factor, top_k)
    e = per_rank * ep
    for rank, res in enumerate(results):
        rows = slice(rank * N, (rank + 1) * N)
        y = res["y"]
        if capacity_factor is not None:
            cap = expert_capacity(N, num_experts=e, k=top_k, capacity_factor=capacity_factor)
            lost = ~keep_mask(ref["experts"][rows], num_experts=e, capacity=cap).any(dim=1)
            if bool(lost.any()) and not torch.allclose(y[lost], ref["x"][rows][lost]):
                fail(f"{what}: the {int(lost.sum())} tokens dropped by all their experts "
                     "differ from their input", rank=rank, hint=h.RESIDUAL)
        assert_close(y, ref["y"][rows], name=f"{what}: y", rank=rank, **F64_TOL,
                     hint=story(y, [(w[rows], hint) for w, hint in wrong]) or fallback)
        mine = slice(per_rank * rank, per_rank * (rank + 1))
        names = ("x", "the gates", "this rank's w1", "this rank's w2")
        for name, got, want in zip(names, res["grads"], ref["grads"], strict=True):
            part = want[rows] if name in ("x", "the gates") else want[mine]
            assert_close(got, part, name=f"{what}: grad of sum(y * u) w.r.t. {name}",
                         rank=rank, **F64_TOL,
                         hint="the backward of an all-to-all is the all-to-all with the split "
                              "sizes swapped; let autograd see every step")


def _floats(events: list) -> list:
    return [e for e in events if e[0] == "all_to_all_single" and len(e[1]) == 2
            and e[1][1] == C]


def _where(ep: int, per_rank: int, top_k: int) -> str:
    k = "" if top_k == h.K else f", k = {top_k}"
    return f"{ep} ranks ({per_rank * ep} experts, {per_rank} per rank{k})"


def _each(results: list, per_rank: int, top_k: int) -> list[tuple[int, int, list, str]]:
    """(experts per rank, k, every rank's results, fallback hint) of each configuration run."""
    runs = h.configs(per_rank, top_k)
    return [(p, k, [res[i] for res in results], h.varied(p, k) if i else h.OTHER)
            for i, (p, k) in enumerate(runs)]


@harness.exercise(KEYS["ep_moe"])
def check_ep_moe(ep_moe: Callable, *, world_size: int = 2, experts_per_rank: int = 2,
                 top_k: int = h.K, timeout: float = harness.CHECK_TIMEOUT_S,
                 quiet: bool = False) -> None:
    """ep_moe(x, gates, experts, shard) on `world_size` = ep ranks against one device, each
    token routed to `top_k` experts, `experts_per_rank` experts on each rank."""
    harness.not_reexport(ep_moe, name="ep_moe")
    ep = world_size
    results = _run(_ep_worker, ep, ep_moe, experts_per_rank, None, top_k, what="ep_moe",
                   timeout=timeout)
    for per_rank, k, rs, fallback in _each(results, experts_per_rank, top_k):
        _compare(rs, ep, per_rank, None, k, f"ep_moe on {_where(ep, per_rank, k)}", fallback)
        for rank, res in enumerate(rs):
            if len(_floats(res["forward"])) != 2:
                fail(f"the forward made {len(_floats(res['forward']))} all-to-alls of token "
                     f"rows on {_where(ep, per_rank, k)}, expected 2 (dispatch, then combine)",
                     rank=rank, hint="send every token copy in one all_to_all_single and bring "
                     "the results back in one")
    if not quiet:
        print(f"ep_moe OK on {_where(ep, experts_per_rank, top_k)}: output and gradients match "
              "the single-device MoE; the split sizes fit the routing")


@harness.exercise(KEYS["ep_capacity"], needs={
    KEYS["capacity"]: "expert_capacity and keep_mask (exercise 2)",
    KEYS["ep_moe"]: "AllToAll (exercise 3)"})
def check_ep_capacity(ep_moe_capacity: Callable, *, world_size: int = 2,
                      experts_per_rank: int = 2, capacity_factor: float = CAPACITY_FACTOR,
                      top_k: int = h.K, timeout: float = harness.CHECK_TIMEOUT_S,
                      quiet: bool = False) -> dict:
    """ep_moe_capacity(x, gates, experts, shard, capacity) against the single-device MoE with
    the same drops; returns the forward all-to-all bytes of rank 0, measured and modelled."""
    from parlab.moe.costs import ep_a2a_bytes
    from parlab.moe.layer import expert_capacity

    harness.not_reexport(ep_moe_capacity, name="ep_moe_capacity")
    ep, phi = world_size, capacity_factor
    results = _run(_ep_worker, ep, ep_moe_capacity, experts_per_rank, phi, top_k,
                   what="ep_moe_capacity", timeout=timeout)
    for per_rank, k, rs, fallback in _each(results, experts_per_rank, top_k):
        e = per_rank * ep
        where = f"{_where(ep, per_rank, k)}, capacity factor {phi:g}"
        _compare(rs, ep, per_rank, phi, k, f"ep_moe_capacity on {where}", fallback)
        c = expert_capacity(N, num_experts=e, k=k, capacity_factor=phi)
        for rank, res in enumerate(rs):
            shapes = [s for _, s, _ in _floats(res["forward"])]
            if shapes != [(e * c, C)] * 2:
                fail(f"the forward's all-to-alls of token rows on {where} had shapes {shapes}; "
                     f"expected two of ({e} * {c}, {C}) = {(e * c, C)}", rank=rank,
                     hint=h.STATIC)
    e = experts_per_rank * ep
    c = expert_capacity(N, num_experts=e, k=top_k, capacity_factor=phi)
    measured = sum(b for _, _, b in _floats(results[0][-1]["forward"]))
    model = ep_a2a_bytes(N, C, ep, num_experts=e, k=top_k, capacity_factor=phi, dtype_bytes=8)
    if not quiet:
        print(f"ep_moe_capacity OK on {_where(ep, experts_per_rank, top_k)} (capacity {c} per "
              "expert and rank): output and gradients match the single-device MoE with the "
              "same drops; static buffers")
    return {"measured": measured, "model": model, "capacity": c, "ep": ep, "n_tokens": N,
            "hidden": C, "k": top_k, "num_experts": e, "capacity_factor": phi}
