"""The micro-batch counts found by trying m = 1, 2, ... with exact fractions, instead of the
closed form."""

from fractions import Fraction

PASSES = ['check_tp_vs_pp']


def tp_vs_pp(h, b, s, t, p, max_bubble):
    allreduce = 2 * (t - 1) / t * b * s * h * 2
    x = Fraction(repr(float(max_bubble)))

    def smallest(v):
        m = 1
        while Fraction(p - 1, v * m + p - 1) > x:
            m += 1
        return m
    return {"allreduce_bytes": allreduce, "layer_bytes": 4 * allreduce, "m": smallest(1),
            "m_interleaved": smallest(2)}
