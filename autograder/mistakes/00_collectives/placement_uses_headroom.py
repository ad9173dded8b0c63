"""Mistake: placement computes the headroom with the course's own parlab.costs.headroom.

Replaces the exercise-2 answer cell's placement (the learner's intensities stay).
"""

from parlab import costs

CAUGHT_BY = {"check_placement": "parlab.costs' FLOPs-per-byte functions"}


def placement(h, n_tokens, flops_per_s, bytes_per_s):
    out = {}
    for name, offered in (("tp", tp_intensity(h)), ("dp", dp_intensity(n_tokens))):  # noqa: F821
        room = costs.headroom(offered, flops_per_s, bytes_per_s)  # wrong: the course's answer
        out[name] = {"compute_bound": room >= 1, "headroom": room}
    return out
