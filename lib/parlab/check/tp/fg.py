r"""Module 02, exercise 1: Megatron's conjugate operators f and g.

Rank r's input is filled with r and its upstream gradient with r + 1, in float64, so every
expected value is a small whole number and the comparison is exact:
f(x) = r, its input gradient $\sum_q (q+1) = \frac{t(t+1)}{2}$; g(x) = $\sum_q q =
\frac{t(t-1)}{2}$, its input gradient r + 1. The tracer says which pass made a collective;
neither operator may change the tensor it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, run_checked
from parlab.check.tp import hints
from parlab.check.tp.common import backward, cpu, env, guard, traced, unchanged
from parlab.check.tp.compare import kinds, reject_reference
from parlab.check.tp.keys import KEY_F_G

__all__ = ["check_f_g"]


def _fg_worker(f: Callable, g: Callable) -> dict:
    rank, t, dev = env()
    guard()
    out = {}
    for name, op in (("f", f), ("g", g)):
        x = torch.full((3, 4), float(rank), dtype=torch.float64, device=dev, requires_grad=True)
        y, fwd = traced(f"{name}(x)", op, x)
        unchanged(torch.full((3, 4), float(rank), dtype=torch.float64), x,
                  f"x (the tensor given to {name})", rank)
        up = torch.full((3, 4), float(rank + 1), dtype=torch.float64, device=dev)
        bwd = backward(f"{name}(x)", y, up, rank)
        out[name] = {"y": cpu(y), "grad": cpu(x.grad), "forward": fwd, "backward": bwd}
    return out


def _fg_story(name: str, part: str, got: Any, r: int, t: int) -> str:
    s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2
    v = float(got.flatten()[0]) if isinstance(got, torch.Tensor) and got.numel() else None
    stories = {
        ("f", "forward"): {s0: "f's forward all-reduced: f is the identity in forward",
                           t * r: "f's forward multiplied by t"},
        ("f", "backward"): {r + 1: "f's backward returned the gradient unchanged: "
                                   + hints.F_BACKWARD,
                            t * s1: "the gradient was all-reduced twice: " + hints.F_BACKWARD
                            + ", once"},
        ("g", "forward"): {r: "g's forward returned its input: g's forward must all-reduce "
                              "(sum the ranks' partial results)",
                           t * s0: "g's forward all-reduced twice: once is the sum"},
        ("g", "backward"): {s1: "g's backward all-reduced: " + hints.G_BACKWARD,
                            0.0: "g's backward returned zeros: " + hints.G_BACKWARD},
    }[(name, part)]
    return next((h for val, h in stories.items() if v is not None and v == val and
                 bool((got == v).all())), f"see the table of f and g above ({name} {part})")


def _check_values(res: dict, rank: int, t: int) -> None:
    s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2
    want = {("f", "forward"): float(rank), ("f", "backward"): s1,
            ("g", "forward"): s0, ("g", "backward"): float(rank + 1)}
    for (name, part), value in want.items():
        got = res[name]["y" if part == "forward" else "grad"]
        if not isinstance(got, torch.Tensor):
            what = "gave no gradient for x" if part == "backward" else "is not a tensor"
            fail(f"{name}(x) {what}", rank=rank,
                 hint=f"the {part} of {name} must return a tensor like x")
        label = f"{name}(x)" if part == "forward" else f"grad of x through {name}"
        ctx = f" (x = {rank} everywhere on rank {rank}, upstream gradient = rank + 1)"
        assert_close(got, torch.full_like(got, value), name=label + ctx, rank=rank,
                     rtol=0, atol=0, hint=_fg_story(name, part, got, rank, t))


def _check_events(res: dict, rank: int) -> None:
    expected = {("f", "forward"): [], ("f", "backward"): ["all_reduce"],
                ("g", "forward"): ["all_reduce"], ("g", "backward"): []}
    for (name, part), want in expected.items():
        got = [k for k, _, _ in res[name][part]]
        if got != want:
            fail(f"the {part} of {name} made these collective calls: "
                 f"{kinds(res[name][part])}; expected {', '.join(want) or 'none'}",
                 rank=rank, hint="f: forward identity, backward all-reduce; g: forward "
                 "all-reduce, backward identity; nothing else")


@exercise(KEY_F_G)
def check_f_g(f: Callable, g: Callable, *, world_size: int = 2,
              timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """f: forward identity / backward all-reduce; g: forward all-reduce / backward identity.

    Rank r's input is all r and its upstream gradient all r + 1 (float64, exact)."""
    reject_reference(f, "f")
    reject_reference(g, "g")
    t = world_size
    results = run_checked(_fg_worker, t, f, g, what="f and g", timeout=timeout,
                          hang_hint=hints.HANG)
    for rank, res in enumerate(results):
        _check_values(res, rank, t)
        _check_events(res, rank)
    if not quiet:
        s0, s1 = t * (t - 1) / 2, t * (t + 1) / 2
        print(f"f and g OK on {t} ranks: f(x) = x and its backward sums to t(t+1)/2 = {s1:g}; "
              f"g(x) sums to t(t-1)/2 = {s0:g} and its backward passes r + 1 through")
