"""Mistake: the restart cost R is left out of the overhead. It does not move the best interval
(R/M is the same share whatever τ), so the policy is right; the overhead reported is R/M too
small: every failure costs the re-launch, the reload and the warm-up as well.

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "R ignored"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    def overhead(tau, stall, write):
        return (stall + max(0.0, write - tau)) / tau + (tau / 2 + write) / mtbf_s  # wrong: no R

    options = []
    for mode, stall, write in (("sync", sync_save_s, 0.0),
                               ("async", async_stall_s, async_write_s)):
        tau = max(math.sqrt(2 * stall * mtbf_s), write)
        options.append((overhead(tau, stall, write), tau, mode))
    cost, tau, mode = min(options)
    return tau, mode, cost
