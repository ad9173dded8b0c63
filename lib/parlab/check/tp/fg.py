r"""Module 02, exercise 1: Megatron's conjugate operators f and g.

Rank r's input $x_r$ and upstream gradient $u_r$ are (3, 4) tensors of random whole numbers
from -9 to 9 in float64, different on every rank and in every entry, so every expected value is
a whole number and the comparison is exact: f(x) = $x_r$, its input gradient $\sum_q u_q$;
g(x) = $\sum_q x_q$, its input gradient $u_r$. The tracer says which pass made a collective;
neither operator may change the tensor it was given. A wrong value is matched against what the
known mistakes give on the same inputs (the identity where an all-reduce belongs, an
all-reduce too many, one with MAX or AVG instead of SUM, zeros), every match named.

A right answer does not depend on, and the tests vary: the world size (visible 2 and 3 ranks,
hidden 3 and 4), the values on each rank and in each entry (so a reduction other than SUM, or
entries mixed up, cannot agree by chance, as it did when rank r's input was r everywhere: MAX
of 0 and 1 is their sum), the upstream gradient (random, never 1), `seed`.
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
SHAPE = (3, 4)


def _values(rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_r, u_r): rank r's input and upstream gradient, whole numbers in [-9, 9], float64."""
    gen = torch.Generator().manual_seed(seed * 101 + rank)
    x = torch.randint(-9, 10, SHAPE, generator=gen).double()
    return x, torch.randint(-9, 10, SHAPE, generator=gen).double()


def _fg_worker(f: Callable, g: Callable, seed: int) -> dict:
    rank, t, dev = env()
    guard()
    out = {}
    x0, u0 = _values(rank, seed)
    for name, op in (("f", f), ("g", g)):
        x = x0.clone().to(dev).requires_grad_()
        y, fwd = traced(f"{name}(x)", op, x)
        unchanged(x0, x, f"x (the tensor given to {name})", rank)
        bwd = backward(f"{name}(x)", y, u0.to(dev), rank)
        out[name] = {"y": cpu(y), "grad": cpu(x.grad), "forward": fwd, "backward": bwd}
    return out


def _wrong(name: str, part: str, r: int, t: int, seed: int) -> list[tuple[torch.Tensor, str]]:
    """What the known mistakes of one pass give on rank r, with their likely-mistake lines."""
    xs, us = zip(*(_values(q, seed) for q in range(t)), strict=True)
    sx, su = sum(xs), sum(us)
    reduce_as = {"MAX": (torch.stack(xs).amax(0), torch.stack(us).amax(0)),
                 "AVG": (sx / t, su / t)}
    op = {k: v[0 if part == "forward" else 1] for k, v in reduce_as.items()}
    other_op = [(v, f"{name}'s {part} all-reduced with op={k}: the all-reduce of f and g sums "
                    "(dist.ReduceOp.SUM, the default)") for k, v in op.items()]
    table: dict[tuple[str, str], list[tuple[Any, str]]] = {
        ("f", "forward"): [(sx, "f's forward all-reduced: f is the identity in forward"),
                           (t * xs[r], "f's forward multiplied by t")],
        ("f", "backward"): [(us[r], "f's backward returned the gradient unchanged: "
                             + hints.F_BACKWARD),
                            (t * su, "the gradient was all-reduced twice: " + hints.F_BACKWARD
                             + ", once"), *other_op],
        ("g", "forward"): [(xs[r], "g's forward returned its input: g's forward must "
                            "all-reduce (sum the ranks' partial results)"),
                           (t * sx, "g's forward all-reduced twice: once is the sum"),
                           *other_op],
        ("g", "backward"): [(su, "g's backward all-reduced: " + hints.G_BACKWARD),
                            (torch.zeros(SHAPE, dtype=torch.float64),
                             "g's backward returned zeros: " + hints.G_BACKWARD)],
    }
    return table[(name, part)]


def _fg_story(name: str, part: str, got: Any, r: int, t: int, seed: int) -> str:
    found = [h for v, h in _wrong(name, part, r, t, seed)
             if isinstance(got, torch.Tensor) and got.shape == v.shape
             and torch.equal(got.double(), v)]
    if not found:
        return f"see the table of f and g above ({name} {part})"
    return found[0] if len(found) == 1 else (
        "these inputs cannot tell two mistakes apart: either " + "; or ".join(found))


def _check_values(res: dict, rank: int, t: int, seed: int) -> None:
    xs, us = zip(*(_values(q, seed) for q in range(t)), strict=True)
    want = {("f", "forward"): xs[rank], ("f", "backward"): sum(us),
            ("g", "forward"): sum(xs), ("g", "backward"): us[rank]}
    for (name, part), value in want.items():
        got = res[name]["y" if part == "forward" else "grad"]
        if not isinstance(got, torch.Tensor):
            what = "gave no gradient for x" if part == "backward" else "is not a tensor"
            fail(f"{name}(x) {what}", rank=rank,
                 hint=f"the {part} of {name} must return a tensor like x")
        label = f"{name}(x)" if part == "forward" else f"grad of x through {name}"
        ctx = " (x and the upstream gradient: whole numbers, different on every rank)"
        assert_close(got, torch.as_tensor(value), name=label + ctx, rank=rank,
                     rtol=0, atol=0, hint=_fg_story(name, part, got, rank, t, seed))


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
def check_f_g(f: Callable, g: Callable, *, world_size: int = 2, seed: int = 0,
              timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """f: forward identity / backward all-reduce; g: forward all-reduce / backward identity.

    Rank r's input and upstream gradient: random whole numbers (float64, exact; module doc)."""
    reject_reference(f, "f")
    reject_reference(g, "g")
    t = world_size
    results = run_checked(_fg_worker, t, f, g, seed, what="f and g", timeout=timeout,
                          hang_hint=hints.HANG)
    for rank, res in enumerate(results):
        _check_values(res, rank, t, seed)
        _check_events(res, rank)
    if not quiet:
        print(f"f and g OK on {t} ranks: f(x) = x and its backward sums the {t} ranks' "
              "gradients; g(x) sums the ranks' inputs and its backward passes each rank's "
              "gradient through (random whole numbers, compared exactly)")
