"""Mistake: v_stage_of uses the looped placement, chunk c of rank r = stage c p + r.

Replaces the exercise-4 answer's `v_stage_of`. For chunk 0 both placements agree (stage r),
so a check of chunk 0 alone passes; for chunk 1 the looped stage p + r sends the micro-batch
round again instead of back up the V. The check names the looped placement.
"""

CAUGHT_BY = {
    "check_dualpipe_v": "that is the looped placement",
}


def v_stage_of(rank, chunk, p):
    return chunk * p + rank  # wrong: the V's chunk 1 is stage 2p - 1 - rank
