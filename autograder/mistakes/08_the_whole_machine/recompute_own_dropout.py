"""The layer uses torch's own dropout instead of the course's: other random draws (and a
different saved mask), so the output is not the layer's."""

CAUGHT_BY = {"check_recompute": "dropout and attention_core from parlab.model.recompute"}


def dropout(x, p, training):
    return F.dropout(x, p, training)  # noqa: F821  the mistake
