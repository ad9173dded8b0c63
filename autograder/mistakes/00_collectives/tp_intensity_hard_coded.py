"""Mistake: tp_intensity returns the worked example's 8192 whatever h is.

Right at the visible test's numbers (H = 8192); the hidden tests use other hidden sizes.

Replaces the exercise-2 answer cell's tp_intensity.
"""

CAUGHT_BY = {"hidden:interconnect_intensities_test": "the worked example's value"}


def tp_intensity(h):
    return 8192.0  # wrong: a constant
