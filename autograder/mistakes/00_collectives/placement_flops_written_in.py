"""Mistake: placement uses the worked example's 989.4 TFLOP/s, not its flops_per_s argument.

Right at the worked example's points (an H100's bf16 rate on its three links), which were all
the visible test tried; wrong for any other device. The visible test now adds random points.

Replaces the exercise-2 answer cell's placement (the learner's intensities stay).
"""

CAUGHT_BY = {"check_placement": "the worked example's 989.4 TFLOP/s written in"}


def placement(h, n_tokens, flops_per_s, bytes_per_s):
    need = link_requirement(989.4e12, bytes_per_s)  # noqa: F821  wrong: flops_per_s
    out = {}
    for name, offered in (("tp", tp_intensity(h)), ("dp", dp_intensity(n_tokens))):  # noqa: F821
        room = offered / need
        out[name] = {"compute_bound": room >= 1, "headroom": room}
    return out
