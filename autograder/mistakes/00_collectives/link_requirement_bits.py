"""Mistake: link_requirement converts the bandwidth from bits, dividing by 8 once more.

bytes_per_s is already in bytes per second.

Replaces the exercise-2 answer cell's link_requirement.
"""

CAUGHT_BY = {"check_intensities": "bits against bytes"}


def link_requirement(flops_per_s, bytes_per_s):
    return flops_per_s / (bytes_per_s / 8)  # wrong: bytes_per_s is not in bits
