"""Mistake: Young's interval without its 2, sqrt(δM): the derivative of δ/τ + τ/(2M) is
-δ/τ² + 1/(2M), zero at sqrt(2 δ M). The overhead reported is the right one for that interval.

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "that is sqrt(δM)"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    def overhead(tau, stall, write):
        return (stall + max(0.0, write - tau)) / tau + (tau / 2 + write + restart_s) / mtbf_s

    options = []
    for mode, stall, write in (("sync", sync_save_s, 0.0),
                               ("async", async_stall_s, async_write_s)):
        tau = max(math.sqrt(stall * mtbf_s), write)  # wrong: no 2
        options.append((overhead(tau, stall, write), tau, mode))
    cost, tau, mode = min(options)
    return tau, mode, cost
