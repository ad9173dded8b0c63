"""Mistake: the interval is returned in minutes (sqrt(2 δ M) / 60), as a run's configuration
often states it; every argument, and the interval asked for, is in seconds.

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "the interval is in minutes or hours"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    def overhead(tau, stall, write):
        return (stall + max(0.0, write - tau)) / tau + (tau / 2 + write + restart_s) / mtbf_s

    options = []
    for mode, stall, write in (("sync", sync_save_s, 0.0),
                               ("async", async_stall_s, async_write_s)):
        tau = max(math.sqrt(2 * stall * mtbf_s), write)
        options.append((overhead(tau, stall, write), tau, mode))
    cost, tau, mode = min(options)
    return tau / 60, mode, cost  # wrong: minutes
