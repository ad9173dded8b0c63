"""Mistake: a layer's TP bytes are the forward's two all-reduces only.

Problem 2 asks for forward and backward: 2 + 2 = 4 ring all-reduces per layer. Two of them
give half the answer, as 1 byte per element instead of bf16's 2 would: the hint says both.

Replaces tp_vs_pp (exercise 3, practice problem 2; only layer_bytes is wrong).
"""

import math
from fractions import Fraction

CAUGHT_BY = {"check_tp_vs_pp": "the forward's two all-reduces only, or 1 byte per element"}


def tp_vs_pp(h, b, s, t, p, max_bubble):
    allreduce = 2 * (t - 1) / t * b * s * h * 2
    x = Fraction(repr(float(max_bubble)))
    m = max(1, math.ceil((p - 1) * (1 - x) / x))
    m2 = max(1, math.ceil((p - 1) * (1 - x) / (2 * x)))
    return {"allreduce_bytes": allreduce, "layer_bytes": 2 * allreduce,  # wrong: forward only
            "m": m, "m_interleaved": m2}
