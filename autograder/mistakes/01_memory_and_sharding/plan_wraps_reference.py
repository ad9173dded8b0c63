"""Mistake: plan_reshard hands the work to the course's own planner.

A wrapper around parlab.dp.plan_reshard is the same as re-exporting it.

Replaces plan_reshard (exercise 3).
"""

from parlab.dp import fsdp

CAUGHT_BY = {"check_reshard_plan": "parlab.dp.fsdp's planner"}


def plan_reshard(sizes, budget):
    return list(fsdp.plan_reshard(sizes, budget))  # wrong: the course's answer
