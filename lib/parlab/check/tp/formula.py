"""A byte count the learner derives, checked at many sizes, with the course's own cost
functions refused while it runs, and a wrong answer named by the wrong formula it matches.

`check_formula(fn, call_name, points, right, forms)`: fn(b, s, h, t, dtype_bytes) at every
point must equal right(...) (a number, or a dict of numbers); when it does not, every
candidate wrong formula in `forms` that the answer matches at ALL points is named (two
mistakes can give the same function, e.g. counting the forward pass only and counting a ring
all-reduce as (t-1)/t of n: both are named). The points mix t (1 to 8, 3 included) and
dtype_bytes (1, 2, 4), so forms that agree at one point (forgetting dtype_bytes and counting
half the collectives, at dtype_bytes = 2) are told apart.

While fn runs, `COST_FUNCTIONS` raise CheckFailed with the same message as a re-export
(`parlab.errors.reference_message`), through `parlab.errors.refused`.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Iterator
from typing import Any

from parlab.check._compare import fail
from parlab.check._harness import call_learner, not_reexport, on_learner_side
from parlab.errors import reference_message, refused

Point = tuple[int, int, int, int, int]  # b, s, h, t, dtype_bytes
Form = tuple[str, Callable[[int, int, int, int, int], Any]]  # (likely mistake, wrong formula)
POINTS: list[Point] = [(1, 8192, 8192, 8, 2), (2, 5, 48, 2, 4), (4, 2048, 4096, 2, 2),
                       (2, 512, 1024, 4, 4), (1, 1024, 2048, 1, 2), (3, 100, 120, 3, 4),
                       (2, 12, 48, 4, 1)]


def cost_functions() -> dict[str, Callable[..., Any]]:
    """The course's byte counts, by the name a learner would use them under."""
    from parlab import costs
    from parlab.tp import sequence

    return {f"parlab.costs.{fn.__name__}": fn for fn in (
        costs.tp_bytes_per_layer, costs.ring_allreduce_bytes, costs.ring_allgather_bytes,
        costs.ring_reduce_scatter_bytes)} | {
        "parlab.tp.sp_bytes_per_layer": sequence.sp_bytes_per_layer}


@contextlib.contextmanager
def refusing(functions: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """Inside the block each function raises CheckFailed naming itself (`refused`)."""
    with contextlib.ExitStack() as stack:
        for name, fn in functions.items():
            stack.enter_context(refused([fn], reference_message(name)))
        yield


def _matches(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(
            _matches(got[k], v) for k, v in want.items())
    return (isinstance(got, numbers.Real) and not isinstance(got, bool)
            and math.isclose(float(got), want, rel_tol=1e-9, abs_tol=1e-9))


def _describe(want: Any) -> str:
    if isinstance(want, dict):
        return "{" + ", ".join(f"{k!r}: {v:,.0f}" for k, v in want.items()) + "}"
    return f"{want:,.0f}"


def _at_points(fn: Callable[..., Any], call_name: str, points: list[Point]) -> list[Any]:
    """fn at every point, the course's cost functions refused (one call of the verifier)."""
    got: list[Any] = []
    with refusing(cost_functions()):
        for b, s, h, t, d in points:
            call = f"{call_name}(b={b}, s={s}, h={h}, t={t}, dtype_bytes={d})"
            got.append(call_learner(call, fn, b, s, h, t, d))
    return got


def check_formula(fn: Callable[..., Any], *, call_name: str, right: Callable[..., Any],
                  forms: list[Form], expect: str, default_hint: str,
                  points: list[Point] = POINTS) -> None:
    """fn must equal `right` at every point (see the module docstring)."""
    not_reexport(fn, name=call_name)
    got = on_learner_side(_at_points, fn, call_name, points)
    for (b, s, h, t, d), value in zip(points, got, strict=True):
        want = right(b, s, h, t, d)
        if _matches(value, want):
            continue
        call = f"{call_name}(b={b}, s={s}, h={h}, t={t}, dtype_bytes={d})"
        if not isinstance(value, (dict, numbers.Real)) or isinstance(value, bool):
            fail(f"{call} returned {type(value).__name__} ({value!r:.60}), expected {expect}",
                 hint=f"return {expect}")
        everywhere = [why for why, form in forms if all(
            _matches(g, form(*p)) for g, p in zip(got, points, strict=True))]
        here = [why for why, form in forms if _matches(value, form(b, s, h, t, d))]
        found = everywhere or here
        hint = ("; or ".join(found) if len(found) < 2 else
                "either " + "; or ".join(found)) if found else default_hint
        if t == 1 and not _matches(value, want):
            hint = f"with t = 1 there is nobody to talk to: 0 bytes. {hint}"
        fail(f"{call} = {value!r:.80}, expected {_describe(want)}", hint=hint)
