"""Mistake: always async, at Young's interval for the staging stall, sqrt(2 δ_async M): right
when the background write is short, wrong when it outlasts that interval (the next save waits
for it, and a snapshot counts only once written). The overhead reported is that policy's own.

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "less than the background write"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    tau = math.sqrt(2 * async_stall_s * mtbf_s)  # wrong: whatever the write, never sync
    stall = async_stall_s + max(0.0, async_write_s - tau)
    return tau, "async", stall / tau + (tau / 2 + async_write_s + restart_s) / mtbf_s
