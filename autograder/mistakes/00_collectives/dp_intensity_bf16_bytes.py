"""Mistake: dp_intensity counts the all-reduce in bf16 bytes, 4P, giving 1.5 N_tok.

A fair count of what the link carries, but not the exercise's convention (2P gradient
elements). Counting 3P FLOPs per token instead of 6P gives the same 1.5 N_tok, so the hint
names both.

Replaces the exercise-2 answer cell's dp_intensity.
"""

CAUGHT_BY = {"check_intensities": "Two mistakes give exactly this"}


def dp_intensity(n_tokens):
    return 6.0 * n_tokens / 4.0  # the all-reduce as 4P bytes
