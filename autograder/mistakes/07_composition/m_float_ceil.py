"""Mistake: the micro-batch counts solved in floating point, m = ceil((p-1)(1-x)/(v x)).

Where the bubble lands exactly on the limit at a whole m, the float quotient can land a hair
above that whole number: at p = 4 and max_bubble = 0.2, 3 * 0.8 / 0.2 is 12.000000000000002,
and ceil() asks for 13 micro-batches where 12 meet (p-1)/(m+p-1) = 3/15 = 0.2 <= 0.2. On the
problem's own numbers (p = 8, x = 0.15) and at p = 6, x = 0.2 it happens to come out right;
the visible test runs p = 4, x = 0.2 too.

Replaces tp_vs_pp (exercise 3b, practice problem 2).
"""

import math

CAUGHT_BY = {"check_tp_vs_pp": "meets the bound exactly"}


def tp_vs_pp(h, b, s, t, p, max_bubble):
    allreduce = 2 * (t - 1) / t * b * s * h * 2
    m = max(1, math.ceil((p - 1) * (1 - max_bubble) / max_bubble))  # wrong: floats
    m2 = max(1, math.ceil((p - 1) * (1 - max_bubble) / (2 * max_bubble)))
    return {"allreduce_bytes": allreduce, "layer_bytes": 4 * allreduce, "m": m,
            "m_interleaved": m2}
