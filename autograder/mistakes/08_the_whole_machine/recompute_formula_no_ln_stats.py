"""saved_bytes_formula is Korthikanti's table as printed, without the LayerNorm statistics
that the measured layer keeps (a mean and a 1/std per token for each of the two)."""

CAUGHT_BY = {"check_recompute": "the LayerNorm statistics are missing"}


def saved_bytes_formula(b, s, h, a, recompute):
    if recompute == "full":
        return 2 * s * b * h
    return 34 * s * b * h + (5 * a * s * s * b if recompute == "none" else 0)  # no 8sb
