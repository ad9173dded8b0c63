"""The comparisons the module-02 checks make in the parent, with a guess at the mistake.

- `compare(results, t, checks, tol)`: each (name, got, expected) on every rank in turn; a wrong
  gradient gets a hint from the pattern of all ranks' values (they add up to the reference: f's
  backward is missing; t times the reference: an all-reduce too many).
- `expect_events`: the collectives of one pass, by kind, on every rank.
- `scale`, `times`, `close`, `bias_counted`: the patterns those hints look for.
- `reject_reference`: an answer that is parlab's own TP code is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import not_reference
from parlab.check.tp import hints
from parlab.check.tp.common import Events

Getter = Callable[[dict], Any]
Check = tuple[str, Getter, Getter]  # (name, got(result), expected(result))


def got(key: str) -> Getter:
    """result -> result[key]: what a rank sent back."""
    return lambda r: r[key]


def ref(key: str) -> Getter:
    """result -> result["ref"][key]: the single-device reference's value."""
    return lambda r: r["ref"][key]


def part(of: Callable[[dict, str], torch.Tensor], key: str) -> Getter:
    """result -> of(result, key): this rank's slice of the reference's value."""
    return lambda r: of(r, key)


def reject_reference(obj: Any, name: str) -> None:
    not_reference(obj, name=name, modules=("parlab.tp",),
                  advice=" (subclass nn.Module or torch.autograd.Function)")


def close(got: Any, ref: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-4) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == ref.shape
            and bool(torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol)))


def scale(got: Any, ref: torch.Tensor) -> float | None:
    """c when got is c * ref, else None."""
    if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
        return None
    r, g = ref.double().flatten(), got.double().flatten()
    if float(r @ r) == 0:
        return None
    c = float(g @ r / (r @ r))
    return c if close(got, c * ref) else None


def times(got: Any, ref: torch.Tensor) -> float | None:
    """c when got is c * ref with c not 1, else None."""
    c = scale(got, ref)
    return c if c is not None and abs(c - 1) > 1e-3 else None


def bias_counted(y: Any, ref: torch.Tensor, bias: torch.Tensor, t: int) -> bool:
    """y = ref + (t - 1) * bias: the bias was added on every rank before the all-reduce."""
    if t == 1 or not isinstance(y, torch.Tensor) or y.shape != ref.shape:
        return False
    c = scale(y - ref, bias.expand_as(ref))
    return c is not None and abs(c - (t - 1)) < 1e-3


def _grad_hint(name: str, rank: int, results: list, key: Callable[[dict], Any],
               ref: Callable[[dict], torch.Tensor], t: int, t_times: str) -> str | None:
    """Why one gradient is wrong, guessed from all ranks' values."""
    got, want = key(results[rank]), ref(results[rank])
    if got is None:
        return (f"{name} is None: no gradient reached it (is something detached, or does a "
                "backward return None?)")
    c = times(got, want)
    if c is not None and abs(c - t) < 1e-3:
        return f"{name} is t = {t} times the reference: {t_times}"
    if name.startswith("grad of x"):
        parts = [key(r) for r in results]
        if all(isinstance(p, torch.Tensor) and p.shape == want.shape for p in parts) and \
                close(sum(parts), want):
            return f"the ranks' {name} add up to the reference: {hints.F_BACKWARD}"
    if c is not None:
        return f"{name} is {c:.4g} times the reference"
    return None


def compare(results: list, t: int, checks: list[Check], tol: dict, hint: str | None = None,
            t_times: str = hints.G_BACKWARD) -> None:
    """checks: (name, got(result), expected(result)) compared on every rank, in order. A
    gradient t times the reference gets `t_times` as its likely mistake."""
    for name, got, want in checks:
        for rank, res in enumerate(results):
            g, w = got(res), want(res)
            if g is None or not close(g, w, **tol):
                why = _grad_hint(name, rank, results, got, want, t, t_times) \
                    if name.startswith("grad") else None
                if g is None:
                    fail(f"{name} is None, expected a tensor of shape {tuple(w.shape)}",
                         rank=rank, hint=why or hint)
                assert_close(g, w, name=name, rank=rank, hint=why or hint, **tol)


def kinds(events: Events) -> str:
    return ", ".join(f"{k} {tuple(s)}" for k, s, _ in events) or "none"


def expect_events(results: list, phase: str, where: str, want: list[str],
                  hint: Callable[[Events], str]) -> None:
    for rank, res in enumerate(results):
        got = [k for k, _, _ in res[phase]]
        if got != want:
            fail(f"the {phase.replace('_', ' ')} of {where} made these collective calls: "
                 f"{kinds(res[phase])}; expected {', '.join(want) or 'none'}", rank=rank,
                 hint=hint(res[phase]))


def shard_story(kind: str, got: torch.Tensor, full: torch.Tensor, rank: int, t: int) -> str:
    """Which block a wrong shard holds, when it is another rank's."""
    dim = 0 if kind == "column" else 1
    for q in range(t):
        if q != rank and got.shape == full.chunk(t, dim)[q].shape and \
                torch.equal(got, full.chunk(t, dim)[q]):
            return f"it holds rank {q}'s shard: rank r keeps block r of {t}"
    return f"rank r keeps block r of {t} along dim {dim} of linear.weight; " + hints.LINEAR_LAYOUT
