"""Mistake: the interleaved schedule's micro-batches come from the ratio form of the bubble.

(p-1)/(v m) is the bubble as a fraction of the useful time, a fine approximation when m is
large; the exercise bounds the bubble's share of the whole step, (p-1)/(v m + p-1) with v = 2
chunks per rank, so m = ceil((p-1)(1-x)/(2x)), not ceil((p-1)/(2x)).

Replaces tp_vs_pp (exercise 3, practice problem 2; only m_interleaved is wrong).
"""

import math
from fractions import Fraction

CAUGHT_BY = {"check_tp_vs_pp": "with v = 2 chunks per rank the bubble is (p-1)/(2m+p-1)"}


def tp_vs_pp(h, b, s, t, p, max_bubble):
    allreduce = 2 * (t - 1) / t * b * s * h * 2
    x = Fraction(repr(float(max_bubble)))
    m = max(1, math.ceil((p - 1) * (1 - x) / x))
    m2 = max(1, math.ceil((p - 1) / (2 * x)))  # wrong: (p-1)/(v m) <= x
    return {"allreduce_bytes": allreduce, "layer_bytes": 4 * allreduce, "m": m,
            "m_interleaved": m2}
