"""Mistake: the async interval from the whole save's time, sqrt(2 δ_sync M): an async save
stalls the loop only for the copy to host memory, so its interval is sqrt(2 δ_async M).

Replaces choose_policy (exercise 2).
"""

import math

CAUGHT_BY = {"check_policy": "its δ is async_stall_s, not the whole save"}


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    def overhead(tau, stall, write):
        return (stall + max(0.0, write - tau)) / tau + (tau / 2 + write + restart_s) / mtbf_s

    tau = max(math.sqrt(2 * sync_save_s * mtbf_s), async_write_s)  # wrong: δ of a sync save
    options = [(overhead(tau, sync_save_s, 0.0), tau, "sync"),
               (overhead(tau, async_stall_s, async_write_s), tau, "async")]
    cost, tau, mode = min(options)
    return tau, mode, cost
