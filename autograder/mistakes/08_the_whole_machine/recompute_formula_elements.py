"""saved_bytes_formula counts elements, not bytes: every activation term is halved (2-byte
activations counted as 1), the masks' bytes as half."""

CAUGHT_BY = {"check_recompute": "bytes, not elements"}


def saved_bytes_formula(b, s, h, a, recompute):
    if recompute == "full":
        return s * b * h
    kept = 17 * s * b * h + 2 * 2 * s * b
    return kept + (5 * a * s * s * b / 2 if recompute == "none" else 0)
