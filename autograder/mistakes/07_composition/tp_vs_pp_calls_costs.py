"""Mistake: tp_vs_pp takes the micro-batches from parlab.costs.min_microbatches.

The exercise is the bubble bound itself (with the exact comparison it needs). Calling the
course's own function computes nothing; it is refused while the check runs, with the message
a bare re-export gets.

Replaces tp_vs_pp (exercise 3, practice problem 2).
"""

from parlab import costs

CAUGHT_BY = {"check_tp_vs_pp": "the course's own reference implementation"}


def tp_vs_pp(h, b, s, t, p, max_bubble):
    allreduce = 2 * (t - 1) / t * b * s * h * 2
    return {"allreduce_bytes": allreduce, "layer_bytes": 4 * allreduce,
            "m": costs.min_microbatches(p, max_bubble),  # wrong: the course's own answer
            "m_interleaved": costs.min_microbatches(p, max_bubble, 2)}
