r"""Module 09, exercise 2, `check_policy(choose_policy)`: how often to save, and how.

`choose_policy(mtbf_s, sync_save_s, async_stall_s, async_write_s, restart_s)` returns
`(interval_s, mode, overhead)`: seconds of training between saves, "sync" or "async", and the
share of time the policy loses under the model of the notebook (`parlab.costs.checkpointing`):

    overhead(τ) = (δ + max(0, w - τ))/τ + (τ/2 + w + R)/M,
    sync: δ = sync_save_s, w = 0;   async: δ = async_stall_s, w = async_write_s.

Graded on the overhead, not on a formula: the policy's overhead (computed here from its
interval and mode) must be within `TOL` of the best one, which this check finds by a numeric
minimisation over τ for each mode (a log grid, then golden sections), never from the closed
form; then the overhead the answer reports must be its policy's own (rel 1e-3).

What a right answer must not depend on, and how the tests vary it:

- which mode wins: visible, the Llama 3 failure rate with a fast background write (async at
  Young's interval), an hourly failure with a 15-minute background write (sync), and a
  failure every 3 h whose async save is held back by its write (async at τ = w); hidden,
  other failure rates and costs on both sides and another τ = w case;
- the restart cost (R = 0 hidden) and the sizes of the numbers (seconds throughout; four
  seeded random cases hidden).

While the answer runs, parlab.costs' checkpoint-policy functions are refused.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable
from typing import Any

from parlab import costs
from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.errors import reference_message

__all__ = ["check_policy", "CASES", "HIDDEN", "TOL", "REFUSED", "numeric_best"]

Case = tuple[str, float, float, float, float, float]  # name, M, sync, stall, write, R
CASES: list[Case] = [
    ("Llama 3's failure rate (419 in 54 days), a 60 s save, a 90 s background write",
     54 * 86400 / 419, 60.0, 4.0, 90.0, 600.0),
    ("a failure every hour, a 2 min save, a 15 min background write", 3600.0, 120.0, 10.0,
     900.0, 600.0),
    ("a failure every 3 h, async limited by its 500 s write", 10800.0, 60.0, 2.0, 500.0, 900.0),
]
HIDDEN: list[Case] = [
    ("a failure a day, a 5 min save, a 400 s background write", 86400.0, 300.0, 20.0, 400.0,
     1800.0),
    ("a failure every 30 min, a 5 s save, a 400 s background write", 1800.0, 5.0, 1.0, 400.0,
     60.0),
    ("a failure every 12 h, async limited by its 1500 s write", 43200.0, 200.0, 5.0, 1500.0,
     1200.0),
    ("a failure every 6 h, no restart cost", 21600.0, 30.0, 2.0, 45.0, 0.0),
]
TOL = 2e-3
"""How far above the best overhead a policy may be (relative): a numeric search on a 1 %
grid is within 1e-4 of it; sqrt(δM) instead of sqrt(2δM) costs 6 % of the save terms."""
REFUSED = (costs.best_policy, costs.best_interval, costs.young_interval, costs.daly_interval,
           costs.optimal_overhead, costs.policy_overhead, costs.checkpoint_overhead)
WHAT = ("parlab.costs' checkpoint-policy functions (best_policy, best_interval, "
        "young_interval, policy_overhead, checkpoint_overhead, ...)")
SHAPE = ('return a tuple (interval_s, mode, overhead): a number of seconds, "sync" or '
         '"async", and the share of time lost (0.05 for 5 %)')


def _random_cases(n: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        m = 10 ** rng.uniform(3.2, 5)
        sync = 10 ** rng.uniform(0.5, 2.5)
        stall = sync * rng.uniform(0.02, 0.3)
        write = min(sync * 10 ** rng.uniform(0, 1.3), m / 4)  # shorter than the MTBF
        out.append((f"random case {i + 1}", m, sync, stall, write, 10 ** rng.uniform(1, 3.3)))
    return out


def _overhead(mode: str, tau: float, c: Case) -> float:
    _, m, sync, stall, write, r = c
    return costs.policy_overhead(mode, tau, mtbf=m, sync_save=sync,  # type: ignore[arg-type]
                                 async_stall=stall, async_write=write, restart=r)


def numeric_best(c: Case) -> dict[str, tuple[float, float]]:
    """Per mode, (τ, overhead) at the smallest overhead, found numerically: 3000 log-spaced τ
    from 1e-3 M to 30 M, then golden sections between the best point's neighbours."""
    m, out = c[1], {}
    for mode in costs.SAVE_MODES:
        def f(t: float, mode: str = mode) -> float:
            return _overhead(mode, t, c)
        xs = [m * 1e-3 * 3e4 ** (i / 2999) for i in range(3000)]
        i = min(range(len(xs)), key=lambda j: f(xs[j]))
        a, b = xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]
        g = (math.sqrt(5) - 1) / 2
        for _ in range(100):
            x1, x2 = b - g * (b - a), a + g * (b - a)
            a, b = (a, x2) if f(x1) <= f(x2) else (x1, b)
        out[mode] = ((a + b) / 2, f((a + b) / 2))
    return out


def _call_text(c: Case) -> str:
    _, m, sync, stall, write, r = c
    return (f"choose_policy(mtbf_s={m:.6g}, sync_save_s={sync:.6g}, async_stall_s={stall:.6g}, "
            f"async_write_s={write:.6g}, restart_s={r:.6g})")


def _near(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=2e-3)


def _policy_hint(tau: float, mode: str, c: Case, best: dict[str, tuple[float, float]]) -> str:
    _, m, sync, stall, write, _r = c
    delta = sync if mode == "sync" else stall
    winner = min(best, key=lambda k: best[k][1])
    ideal = best[mode][0]
    if _near(tau * 60, ideal) or _near(tau * 3600, ideal):
        return ("the interval is in minutes or hours: every argument is in seconds, and so is "
                "the interval you return (sqrt(2 δ M) with δ and M in seconds)")
    if _near(tau, math.sqrt(delta * m)):
        return ("that is sqrt(δM): setting d/dτ (δ/τ + τ/(2M)) = -δ/τ² + 1/(2M) to zero gives "
                "τ = sqrt(2 δ M), with the 2")
    if mode == "async" and _near(tau, math.sqrt(2 * sync * m)):
        return ("an async save stalls the loop only for the copy to host memory: its δ is "
                "async_stall_s, not the whole save (sync_save_s)")
    if mode == "async" and tau < write * (1 - 2e-3):
        return (f"async every {tau:.4g} s, less than the background write ({write:.4g} s): "
                "each save first waits w - τ for the previous write. Save async at most every "
                "w seconds, and compare with a sync save: a snapshot counts only once written, "
                "so async also loses w/M")
    young = math.sqrt(2 * stall * m)
    if winner == "async" and mode == "sync" and write > young and _near(best["async"][0], write):
        return (f"async saves lose less here ({best['async'][1]:.4%} against "
                f"{best['sync'][1]:.4%} at best for sync), every w = {write:.4g} s: the background "
                f"write outlasts Young's interval sqrt(2 δ M) = {young:.4g} s, so async's best "
                "interval is w (a shorter one waits w - τ for the previous write at every "
                "save): compare sync with async at max(sqrt(2 δ M), w)")
    if mode != winner:
        return (f"{winner} saves lose less here ({best[winner][1]:.4%} against "
                f"{best[mode][1]:.4%} at best for {mode}): compute both modes' overhead, each at "
                "its own best interval, and return the smaller"
                + (" (async pays w/M in lost work: a snapshot is a checkpoint only once "
                   "written)" if mode == "async" else ""))
    return (f"the best {mode} interval here is about {ideal:.4g} s: sqrt(2 δ M)"
            + (", or w when the background write is longer" if mode == "async" else ""))


def _overhead_hint(got: float, want: float, tau: float, mode: str, c: Case) -> str:
    _, m, _sync, _stall, write, r = c
    if r and _near(got, want - r / m):
        return ("R ignored: every failure also costs the restart (re-launch, reload, warm-up), "
                "R/M per second of training")
    if mode == "async" and write and _near(got, want - write / m):
        return ("the async write's w/M is missing: a failure during the write falls back to the "
                "checkpoint before, so each failure loses w more")
    if _near(got, want * 100):
        return "that is a percentage: return the share (0.05 for 5 %)"
    return (f"report the overhead of the policy you return: (δ + max(0, w - τ))/τ + (τ/2 + w + "
            f"R)/M at τ = {tau:.6g} s (sync: δ = the whole save, w = 0)")


def _number(value: Any, what: str, call: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
            float(value)):
        fail(f"{call} returned {what} = {value!r:.60}, expected a finite number", hint=SHAPE)
    return float(value)


@exercise("checkpoint_policy")
def check_policy(choose_policy: Callable, *, hidden: bool = False, random_cases: int = 4,
                 seed: int = 9, quiet: bool = False) -> None:
    """Each case's returned policy within TOL of the numeric best overhead, and its reported
    overhead its own; `hidden` adds HIDDEN and `random_cases` seeded random cases."""
    if getattr(choose_policy, "__wrapped__", choose_policy) in REFUSED:
        fail(reference_message(WHAT))
    not_reexport(choose_policy, name="choose_policy")
    cases = CASES + (HIDDEN + _random_cases(random_cases, seed) if hidden else [])
    for c in cases:
        call = _call_text(c)
        out = call_learner(call, choose_policy, *c[1:], refuse=REFUSED, refusal=WHAT)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            fail(f"{call} returned {out!r:.120}", hint=SHAPE)
        tau, mode = _number(out[0], "interval_s", call), out[1]
        reported = _number(out[2], "overhead", call)
        if mode not in costs.SAVE_MODES:
            fail(f'{call} returned mode {mode!r}, expected "sync" or "async"', hint=SHAPE)
        if tau <= 0:
            fail(f"{call} returned interval_s = {tau}, expected seconds > 0", hint=SHAPE)
        best = numeric_best(c)
        winner = min(best, key=lambda k: best[k][1])
        got = _overhead(mode, tau, c)
        if got > best[winner][1] * (1 + TOL):
            fail(f"{c[0]}: {call} chose {mode} every {tau:.6g} s, which loses {got:.4%} of "
                 f"the time; the best policy loses {best[winner][1]:.4%} ({winner} every "
                 f"{best[winner][0]:.5g} s, found by a numeric search)",
                 hint=_policy_hint(tau, mode, c, best))
        if not math.isclose(reported, got, rel_tol=1e-3, abs_tol=1e-9):
            fail(f"{c[0]}: {call} reported an overhead of {reported:.6g}; {mode} every "
                 f"{tau:.6g} s loses {got:.6g} under the model",
                 hint=_overhead_hint(reported, got, tau, mode, c))
    if not quiet:
        print(f"choose_policy OK on {len(cases)} cases (both modes win somewhere)")
