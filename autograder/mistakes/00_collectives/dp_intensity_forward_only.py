"""Mistake: dp_intensity counts the forward pass's FLOPs only, 2P per token.

Replaces the exercise-2 answer cell's dp_intensity.
"""

CAUGHT_BY = {"check_intensities": "you counted the forward pass only"}


def dp_intensity(n_tokens):
    return 2.0 * n_tokens / 2.0  # wrong: 2P FLOPs per token, no backward
