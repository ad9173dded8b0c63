"""Mistake: v_stage_of numbers rank r's chunk 1 as stage 2p - r, one past the end for r = 0.

Replaces the exercise-4 answer's `v_stage_of`: the stages are 0 .. 2p - 1, so the last one,
rank 0's chunk 1, is 2p - 1.
"""

CAUGHT_BY = {
    "check_dualpipe_v": "stages are numbered 0 .. 2p - 1",
}


def v_stage_of(rank, chunk, p):
    return rank if chunk == 0 else 2 * p - rank  # wrong: 2p - 1 - rank
