"""Mistake: sp_layer_bytes counts elements, not bytes: dtype_bytes is left out.

At dtype_bytes = 2 the answer is half the right one, exactly what counting the forward pass
only gives, so a check that guesses from that one ratio blames the wrong mistake. The check
evaluates the answer at sizes with dtype_bytes 1, 2 and 4 and names the formula that fits all
of them.

Replaces sp_layer_bytes (exercise 4); SPBlock is the learner's.
"""

CAUGHT_BY = {
    "check_sp_bytes": "bsh counts elements: multiply by dtype_bytes",
}


def sp_layer_bytes(b, s, h, t, dtype_bytes=2):
    one = (t - 1) / t * b * s * h  # wrong: elements, not bytes
    return {"all_gather": 4 * one, "reduce_scatter": 4 * one}
