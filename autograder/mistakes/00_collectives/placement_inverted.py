"""Mistake: placement's headroom is required / offered, upside down.

Replaces the exercise-2 answer cell's placement (the learner's intensities stay).
"""

CAUGHT_BY = {"check_placement": "inverted: headroom"}


def placement(h, n_tokens, flops_per_s, bytes_per_s):
    need = link_requirement(flops_per_s, bytes_per_s)  # noqa: F821
    out = {}
    for name, offered in (("tp", tp_intensity(h)), ("dp", dp_intensity(n_tokens))):  # noqa: F821
        room = need / offered  # wrong: inverted
        out[name] = {"compute_bound": room <= 1, "headroom": room}
    return out
