"""Mistake: tp_intensity hands the work to the course's own cost function.

A wrapper around parlab.costs.tp_flops_per_byte is the same as re-exporting it.

Replaces the exercise-2 answer cell's tp_intensity.
"""

from parlab import costs

CAUGHT_BY = {"check_intensities": "parlab.costs' FLOPs-per-byte functions"}


def tp_intensity(h):
    return costs.tp_flops_per_byte(h)  # wrong: the course's answer
