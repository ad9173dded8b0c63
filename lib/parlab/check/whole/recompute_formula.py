r"""Module 08, exercise 2's formula: `saved_bytes_formula(b, s, h, a, recompute)` against
the closed form (Korthikanti et al.'s table, 2-byte activations and 1-byte masks, plus the
two LayerNorms' statistics) at sizes where the wrong forms differ: no LayerNorm statistics,
elements instead of bytes (2x or 1/2), the scores without b. Visible `POINTS`, and
`HIDDEN_POINTS` in the hidden test (a single token, one head, odd sizes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from parlab.check._compare import expect_type, fail
from parlab.check._harness import call_learner, not_reexport

__all__ = ["POLICIES", "POINTS", "HIDDEN_POINTS", "closed_form", "check_formula"]

POLICIES = ("none", "selective", "full")
POINTS = [(2, 20, 24, 3), (1, 2048, 4096, 32), (3, 10, 12, 3), (4, 4096, 8192, 64),
          (1, 7, 15, 5)]
HIDDEN_POINTS = [(5, 9, 18, 6), (2, 8192, 8192, 64), (7, 3, 21, 7), (1, 1, 1, 1)]


def closed_form(b: int, s: int, h: int, a: int, recompute: str) -> int:
    """Bytes kept per layer: Korthikanti's table (2-byte activations, 1-byte masks) plus the
    two LayerNorms' mean and reciprocal std per token (2 bytes each)."""
    ln_stats = 2 * 2 * 2 * s * b
    return {"none": 34 * s * b * h + 5 * a * s * s * b + ln_stats,
            "selective": 34 * s * b * h + ln_stats, "full": 2 * s * b * h}[recompute]


def check_formula(formula: Callable[..., Any], points: list[tuple[int, int, int, int]], *,
                  refuse: list[Any], refusal: str) -> None:
    """`saved_bytes_formula` against `closed_form` at `points`, every policy; the wrong forms
    named."""
    not_reexport(formula, name="saved_bytes_formula")
    for b, s, h, a in points:
        for policy in POLICIES:
            call = f"saved_bytes_formula(b={b}, s={s}, h={h}, a={a}, recompute={policy!r})"
            got = call_learner(call, functools.partial(formula, b, s, h, a, policy),
                               refuse=refuse, refusal=refusal)
            expect_type(got, (int, float), name=call, what="a number of bytes")
            want = closed_form(b, s, h, a, policy)
            if abs(got - want) <= 1e-9 * want:
                continue
            without_ln = closed_form(b, s, h, a, policy) - (8 * s * b if policy != "full" else 0)
            hint = ("the LayerNorm statistics are missing: each of the two LayerNorms keeps a "
                    "mean and a reciprocal std per token, 2 bytes each, 8sb in all"
                    if abs(got - without_ln) <= 1e-9 * want and policy != "full" else
                    "bytes, not elements: activations are 2 bytes (bf16), masks 1"
                    if abs(got - want / 2) <= 1e-9 * want else
                    "every term twice the table's: 4-byte (fp32) activations and 2-byte masks; "
                    "the table's activations are bf16 (2 bytes), its masks bool (1 byte)"
                    if abs(got - 2 * want) <= 1e-9 * want
                    else "none keeps 34sbh + 5as²b + 8sb, selective drops the 5as²b of scores, "
                         "full keeps only the layer's input, 2sbh")
            fail(f"{call} returned {got:,}, expected {want:,}", hint=hint)
