"""Mistake: each mode at Young's interval sqrt(2 δ M), the async one too, never held back to
the background write w: when w is longer than that interval, every async save first waits
w - τ for the previous write, so async looks worse than it is at τ = w, and the answer picks
sync where async at τ = w wins. The overhead reported is that policy's own.

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "so async's best interval is w"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    def overhead(tau, stall, write):
        return (stall + max(0.0, write - tau)) / tau + (tau / 2 + write + restart_s) / mtbf_s

    options = []
    for mode, stall, write in (("sync", sync_save_s, 0.0),
                               ("async", async_stall_s, async_write_s)):
        tau = math.sqrt(2 * stall * mtbf_s)  # the mistake: not max(..., write) for async
        options.append((overhead(tau, stall, write), tau, mode))
    cost, tau, mode = min(options)
    return tau, mode, cost
