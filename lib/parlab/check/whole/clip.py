r"""Module 08, exercise 5: one gradient norm for the whole grid, `clip_grad_norm_`.

`clip_grad_norm_(specs, max_norm, grid)` runs on every rank; `specs` is this rank's
`parlab.compose.shard_specs(rep)` after step 0's backward and `finalize_grads` (the check
builds them: `setup` at lr 0, `train_step`). It must return the single-device model's total
gradient norm, the same on every rank, and scale every gradient piece in place by
$\min(1, \mathrm{max\_norm}/(\|g\| + 10^{-6}))$. Compared, computed in the kernel on one
device: `torch.nn.utils.clip_grad_norm_` on `parlab.model.Llama` after the same batch, its norm
(relative 1e-5) and its clipped gradients at each piece's offsets (1e-4 of each tensor's
largest entry: step 0's gradients on a grid differ from one device's by float32 rounding).
Each grid is called twice: max_norm at twice the norm (nothing may change: the coefficient is
clamped at 1), then at half the norm.

Grids: visible, 4 ranks, PP 2 × TP 2 (RMSNorms whole on both TP ranks, the embedding split
by the vocabulary, the tied embedding on both pipeline ends), DP 2 × TP 2 + SP (every piece
on both replicas), the MoE variant on EP 2 × TP 2 + SP (dense tensors on both ep ranks,
experts split) and CP 2 × PP 2 (every piece on both CP ranks); hidden, 8 ranks
DP 2 × PP 2 × TP 2 + SP, and 4 ranks with the MoE variant on EP 2 × PP 2 and CP 2 × TP 2.

What a right answer must not depend on, and how the tests vary it:

- which axes copy a piece: TP (tensors TP leaves whole), EP (dense tensors of an MoE
  model), the tied embedding's copy, the DP and the CP replicas, each on a visible grid,
  so an owner rule that forgets one fails the visible test, and other combinations hidden;
- the grid's sizes and the model: dense and MoE, 4 and 8 ranks;
- where max_norm lies: above the norm (the coefficient is clamped: nothing may change) and
  below it, on every grid.

A wrong norm is explained from the single device's squares: the square of the norm (the root
left out); for every set of the copies a grid holds (TP, EP, the tied embedding, the dp·cp
replicas), the norm that counting each of them as often as it is held gives; norms that
differ between ranks traced to the axis they differ along; a sum of norms instead of squares;
otherwise only too large or too small, with what could cause it (`clip_hints`). parlab's own
`clip_grad_norm_` (and its `owns`) refuse to run in the ranks while the answer runs.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport, refuse_in_rank, run_checked
from parlab.check.whole.clip_hints import (
    AXIS,
    PER_RANK,
    SQUARED,
    SQUARES,
    TOO_LARGE,
    TOO_SMALL,
    copy_sets,
    counted_twice,
)

__all__ = ["check_clip_grad_norm", "KEY_CLIP"]

KEY_CLIP = "08.clip_grad_norm"
TIMEOUT_S = 30.0  # one launch, 8 ranks at most: ~3 s alone on 2 cores, ~10 s at 3x the load
NORM_RTOL = 1e-5  # float32 sums in another order: ~1e-7 relative measured
GRAD_TOL = 1e-4  # of each tensor's largest entry, as tests/test_compose.py's step-0 gradients
SAME_RTOL = 1e-6  # ranks that computed the same total agree to rounding
HANG = ("a collective that only some ranks reach: every rank must make the same all-reduces, "
        "over the world or over its own groups (grid.embedding is None between the ends)")


def _cases(quiet: bool) -> list[tuple[int, list[tuple[str, Any, Any]]]]:
    """(world size, [(label, cfg, plan)]) of the visible or the hidden runs."""
    from parlab.compose import Plan
    from parlab.model import LlamaConfig

    dense, moe = LlamaConfig(), LlamaConfig(moe_layers=(1, 3), capacity_factor=1.0)
    if not quiet:
        return [(4, [("PP 2 × TP 2", dense, Plan(pp=2, tp=2, micro_batch_size=2)),
                     ("DP 2 × TP 2 + SP", dense, Plan(dp=2, tp=2, sequence_parallel=True,
                                                      micro_batch_size=2)),
                     ("MoE EP 2 × TP 2 + SP", moe, Plan(ep=2, tp=2, sequence_parallel=True,
                                                        micro_batch_size=2)),
                     ("CP 2 × PP 2", dense, Plan(cp=2, pp=2, layout="contiguous",
                                                 micro_batch_size=2))])]
    return [(8, [("DP 2 × PP 2 × TP 2 + SP", dense, Plan(
                dp=2, pp=2, tp=2, sequence_parallel=True, micro_batch_size=2))]),
            (4, [("MoE EP 2 × PP 2", moe, Plan(ep=2, pp=2, micro_batch_size=2)),
                 ("CP 2 × TP 2", dense, Plan(cp=2, tp=2, micro_batch_size=2))])]


@functools.lru_cache(maxsize=4)
def _single(cfg: Any, batch_size: int) -> dict[str, torch.Tensor]:
    """The single device's gradients of step 0's whole batch, by name."""
    from parlab.model import Llama, batch, load_corpus

    model = Llama(cfg)
    x, y = batch(load_corpus()[0], 0, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
    Llama.loss(model(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def _clipped(grads: dict[str, torch.Tensor], max_norm: float) -> tuple[float, dict]:
    """torch.nn.utils.clip_grad_norm_ on copies of the single device's gradients."""
    params = {n: torch.nn.Parameter(g.clone()) for n, g in grads.items()}
    for n, p in params.items():
        p.grad = grads[n].clone()
    total = torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)
    return float(total), {n: p.grad for n, p in params.items() if p.grad is not None}


def _norm(value: Any, rank: int, when: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    fail(f"clip_grad_norm_ returned {type(value).__name__} {when}, expected the total norm",
         rank=rank, hint="return the norm as a 0-d tensor, as torch.nn.utils.clip_grad_norm_ "
                         "does (a Python float is accepted too)")


def _grad(spec: Any) -> torch.Tensor:
    """A piece's gradient (finalize_grads leaves none at None)."""
    grad = spec.param.grad
    assert grad is not None, spec.name
    return grad


def _owned_sq(specs: list, grads: list[torch.Tensor], coords: dict[str, int]) -> float:
    """The check's own count: the squares of the pieces this rank is the first holder of."""
    if coords["dp"] or coords["cp"]:
        return 0.0
    return sum(float(g.double().pow(2).sum()) for s, g in zip(specs, grads, strict=True)
               if not (s.tp_dim is None and coords["tp"]) and not s.tied_copy
               and not (s.ep_dim is None and coords["ep"]))


def _piece(spec: Any, coords: dict[str, int]) -> tuple[int, int]:
    """(dim, offset) of this rank's piece in the whole tensor; dim -1 when whole."""
    dim, axis = (spec.ep_dim, "ep") if spec.ep_dim is not None else (spec.tp_dim, "tp")
    return (-1, 0) if dim is None else (dim, coords[axis] * spec.param.shape[dim])


def _real(spec: Any, grad: torch.Tensor) -> torch.Tensor:
    """A piece without the padding rows of a TP vocabulary past V (`spec.rows`, if given)."""
    rows = getattr(spec, "rows", None)
    return grad if rows is None else grad[:rows]


def _worker(clip: Callable[..., Any], cases: list[tuple[str, Any, Any]],
            norms: dict[str, float]) -> dict:
    from parlab.compose import clip as reference
    from parlab.compose import setup, shard_specs, train_step
    from parlab.model import load_corpus

    refuse_in_rank([reference.clip_grad_norm_, reference.owns],
                   "parlab.compose.clip_grad_norm_")
    tokens, rank, out = load_corpus()[0], dist.get_rank(), {}
    for label, cfg, plan in cases:
        rep = setup(cfg, plan, lr=0.0)  # lr 0: the step keeps the weights, leaves the grads
        train_step(rep, 0, tokens)
        specs, coords = shard_specs(rep), dict(rep.grid.coords)
        before = [_grad(s).detach().clone() for s in specs]
        stage = f"clip_grad_norm_(specs, max_norm, grid) on {label}"
        high = call_learner(stage, clip, specs, 2 * norms[label], rep.grid)
        moved = max(float((_grad(s) - b).abs().max() / b.abs().max().clamp_min(1e-30))
                    for s, b in zip(specs, before, strict=True))
        for s, b in zip(specs, before, strict=True):
            s.param.grad = b.clone()
        low = call_learner(stage, clip, specs, norms[label] / 2, rep.grid)
        out[label] = {
            "norms": (_norm(high, rank, "at max_norm above the norm"),
                      _norm(low, rank, "at max_norm below the norm")),
            "moved": moved, "coords": coords, "own": _owned_sq(specs, before, coords),
            "all": sum(float(b.double().pow(2).sum()) for b in before),
            "pieces": [(s.name, *_piece(s, coords), _real(s, _grad(s)).detach().cpu().clone(),
                        _real(s, b).cpu()) for s, b in zip(specs, before, strict=True)],
            "copies": [(s.name, s.tp_dim is None, s.ep_dim is None, s.tied_copy)
                       for s in specs],
        }
    return out


def _differ(results: list[dict], i: int) -> str | None:
    """The grid axis along which the ranks' norms differ (the first found), else None."""
    for a in ("pp", "tp", "ep", "dp", "cp"):
        for r, s in itertools.combinations(results, 2):
            others = [x for x in r["coords"] if x != a]
            if all(r["coords"][x] == s["coords"][x] for x in others) and not math.isclose(
                    r["norms"][i], s["norms"][i], rel_tol=SAME_RTOL):
                return a
    return None


def _judge_norms(results: list[dict], label: str, want: float, grads: dict, plan: Any) -> None:
    on = f"on {label}"
    for i in (0, 1):
        each = [r["norms"][i] for r in results]
        if all(math.isclose(g, each[0], rel_tol=SAME_RTOL) for g in each):
            continue
        shown = ", ".join(f"{g:.6g}" for g in each[:8])
        if all(math.isclose(g, math.sqrt(r["all"]), rel_tol=1e-4)
               for g, r in zip(each, results, strict=True)):
            fail(f"the ranks returned different norms {on}: {shown}", hint=PER_RANK)
        axis = _differ(results, i)
        fail(f"the ranks returned different norms {on}: {shown} (the single device's is "
             f"{want:.6g})", hint=AXIS["dp" if axis == "cp" else axis] if axis else PER_RANK)
    wrong = [float(n) for n in results[0]["norms"] if not math.isclose(n, want,
                                                                        rel_tol=NORM_RTOL)]
    if not wrong:
        return
    got = wrong[0]
    message = (f"the norm {on} is {got:.6g}, the single device's {want:.6g} (torch.nn.utils."
               f"clip_grad_norm_; {got / want:.4f} times it)")
    if math.isclose(got, want * want, rel_tol=1e-4) and not math.isclose(want, 1.0,
                                                                          rel_tol=1e-3):
        fail(message, hint=SQUARED)
    twice = counted_twice(got, grads, copy_sets(results, plan), rtol=NORM_RTOL)
    if twice:
        fail(message, hint=f"copies counted more than once: {twice}")
    if any(math.isclose(got, sum(math.sqrt(r[k]) for r in results), rel_tol=1e-4)
           for k in ("own", "all")):
        fail(message, hint=SQUARES)
    fail(message, hint=TOO_LARGE if got > want else TOO_SMALL)


def _judge_grads(results: list[dict], label: str, clipped: dict, max_norm: float,
                 want: float) -> float:
    worst = 0.0
    for rank, r in enumerate(results):
        if r["moved"] > 1e-6:
            fail(f"with max_norm above the norm on {label}: the gradients changed (by up to "
                 f"{r['moved']:.2g} times their largest entry)", rank=rank,
                 hint="clipping never scales up: the coefficient is min(1, max_norm / "
                      "(norm + 1e-6)), torch.clamp(..., max=1.0)")
        for name, dim, offset, got, before in r["pieces"]:
            ref = clipped[name] if dim < 0 else clipped[name].narrow(dim, offset, got.shape[dim])
            err = float((got - ref).abs().max() / clipped[name].abs().max())
            worst = max(worst, err)
            if err > GRAD_TOL:
                ratio = float((got * before).sum() / (before * before).sum().clamp_min(1e-30))
                coef = max_norm / (want + 1e-6)
                fail(f"{label}, max_norm {max_norm:.4g}: the clipped gradient of {name} is "
                     f"{ratio:.4f} times the unclipped one, expected {coef:.4f}",
                     rank=rank, hint="multiply every p.grad in place (p.grad.mul_(coef)) by "
                                     "coef = min(1, max_norm / (total + 1e-6)), the same total "
                                     "on every rank, the one you return")
    return worst


@exercise(KEY_CLIP)
def check_clip_grad_norm(clip_grad_norm_: Callable[..., Any], *, quiet: bool = False,
                         timeout: float = TIMEOUT_S) -> dict:
    """The learner's clip_grad_norm_ on real ranks against torch.nn.utils.clip_grad_norm_ on
    one device: visible PP 2 × TP 2, DP 2 × TP 2 + SP, MoE EP 2 × TP 2 + SP and CP 2 × PP 2;
    hidden (quiet) DP 2 × PP 2 × TP 2 + SP, MoE EP 2 × PP 2 and CP 2 × TP 2."""
    not_reexport(clip_grad_norm_, name="clip_grad_norm_")
    done: dict[str, dict] = {}
    for world, cases in _cases(quiet):
        for label, cfg, plan in cases:  # one run each: a mistake stops at the first grid
            grads = _single(cfg, plan.global_batch_size)
            wants = {label: _clipped(grads, math.inf)[0]}
            results = run_checked(_worker, world, clip_grad_norm_, [(label, cfg, plan)],
                                  wants, what="clip_grad_norm_", timeout=timeout,
                                  hang_hint=HANG)
            mine = [r[label] for r in results]
            _judge_norms(mine, label, wants[label], grads, plan)
            _, clipped = _clipped(grads, wants[label] / 2)
            worst = _judge_grads(mine, label, clipped, wants[label] / 2, wants[label])
            done[label] = {"norm": mine[0]["norms"][1], "single": wants[label],
                           "grad_error": worst}
    if not quiet:
        shown = "; ".join(f"{k}: {v['norm']:.6g} (one device {v['single']:.6g})"
                          for k, v in done.items())
        print(f"clip_grad_norm_ OK on 4 ranks, the single device's norm and clipped "
              f"gradients: {shown}")
    return done
