"""recompute_forward ignores the policy: nothing is checkpointed, everything is kept."""

CAUGHT_BY = {"check_recompute": "nothing was recomputed"}

_forward = recompute_forward  # noqa: F821


def recompute_forward(layer, x, recompute):
    return _forward(layer, x, "none")  # the mistake
