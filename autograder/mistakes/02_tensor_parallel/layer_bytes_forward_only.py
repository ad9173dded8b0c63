"""Mistake: layer_bytes counts the two all-reduces of the forward pass only.

4(t-1)/t * bsh * dtype_bytes is half the answer. Counting a ring all-reduce as (t-1)/t of its
n bytes (one half of the ring) gives the very same formula, so the check names both; at
dtype_bytes = 2 forgetting dtype_bytes gives the same number too, which the other sizes rule
out.

Replaces layer_bytes (exercise 6); TPBlock is the learner's.
"""

CAUGHT_BY = {
    "check_tp_block": "either count 4 all-reduces per layer",
}


def layer_bytes(b, s, h, t, dtype_bytes=2):
    return 2 * 2 * (t - 1) / t * b * s * h * dtype_bytes  # wrong: forward only
