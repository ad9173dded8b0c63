"""The interval found by trying them: every τ from 1 s up, 0.2 % apart, for each mode, with
the overhead written out; no closed form (and no special case for a long background write)."""

PASSES = ["check_policy"]


def choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s):
    best = None
    for mode, stall, write in (("sync", sync_save_s, 0.0),
                               ("async", async_stall_s, async_write_s)):
        tau = 1.0
        while tau < 10 * mtbf_s:
            waited = stall + max(0.0, write - tau)
            cost = waited / tau + (tau / 2 + write + restart_s) / mtbf_s
            if best is None or cost < best[2]:
                best = (tau, mode, cost)
            tau *= 1.002
    return best
