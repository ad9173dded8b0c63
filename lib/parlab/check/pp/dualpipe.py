r"""Exercise 4 of module 04, `check_dualpipe_v(v_stage_of, dualpipe_v_order)`: DualPipe-V.

1. The V placement by formula: v_stage_of(r, c, p) = r for chunk 0, 2p - 1 - r for chunk 1,
   for p = 1..5 and 8.
2. One rank's order: dualpipe_v_order(r, p, m) for every rank of several (p, m), m >= 2p and
   numbers that are not powers of two included (p = 3, 5; m = 2p + 1, 3p + 2). Each must be a
   list of Actions; put together they must pass `parlab.pp.validate(..., placement="v")`,
   hold 2p + 1 chunk-micro-batches at most on every rank (simulated, t_f = t_b = t_w), and
   equal `parlab.pp.make_schedule("dualpipe_v", p, m)` action for action; the first
   difference is named with the phase (1..8) it falls in.
3. On world_size ranks: the learner's orders run in parlab's executor with the model split by
   the learner's v_stage_of (2p stages of 3 layers, m = 2p + 1 micro-batches of 2 rows) and
   must match the single-device loss and gradients (float64, rtol 1e-9).
While the learner's functions run, parlab's stage_of, rank_and_chunk and DualPipe-V builders
raise CheckFailed. The check uses no earlier exercise's answer.

A right answer must not depend on p, m or the rank: the visible orders run p = 1 to 5 with m
= 2p (the least DualPipe-V runs) up to 2p + 3, every rank of each; the hidden ones p = 3 to 7
with m up to 2p + 5, and the run on ranks 3 and 4; the placement runs p = 1 to 5 and 8.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import parlab.check._harness as harness
from parlab.check._compare import fail
from parlab.check.pp.common import HANG, compare, model_options
from parlab.pp import actions, dualpipe
from parlab.pp import schedules as pp
from parlab.pp.order import validate
from parlab.pp.simulator import simulate

__all__ = ["check_dualpipe_v", "ORDER_CASES"]

ORDER_CASES: list[tuple[int, int]] = [(1, 2), (2, 4), (2, 5), (3, 6), (3, 8), (4, 8), (4, 11),
                                      (5, 13)]
STAGE_REFUSED = [pp.stage_of, pp.rank_and_chunk, actions.placed_stage, actions.placed_rank]
ORDER_REFUSED = [dualpipe.dualpipe_v, dualpipe.dualpipe_v_rank, dualpipe.dualpipe_v_phases,
                 dualpipe._build, dualpipe._Rank]
REFUSAL = "parlab.pp's stage_of / DualPipe-V"
PHASE_HINTS = {
    1: "phase 1 is 2(p - r - 1) forwards of chunk 0: the micro-batches that must already be "
       "on their way down when the first one comes back up through rank r's chunk 1",
    2: "phase 2 is r + 1 times F0 then F1 (chunk 0's forward, then chunk 1's)",
    3: "phase 3 is p - r - 1 times: B1 split (its W waits in the queue), the W at the front "
       "of the queue (that B1's own), then F1",
    4: "phase 4 is m - 2p + r + 1 times the pairs F0&B1 then F1&B0, each a forward followed "
       "by a FULL backward (B, then its W at once); on the last rank (r = p - 1) the first "
       "F0, B1 are the same actions, only not overlapped",
    5: "phase 5 is p - r - 1 times: a full backward of chunk 1 (B1, W1), then the pair F1&B0",
    6: "phase 6 is r + 1 times B1 then B0; the first r + 1 of these 2(r + 1) backwards are "
       "full (W at once), the last r + 1 split (W queued)",
    7: "phase 7 is p - r - 1 times: the W at the front of the queue, then B0 split",
    8: "phase 8 is the r + 1 W's left in the queue, each the W at the front of the queue "
       "(the oldest)",
}
LOOPED = ("that is the looped placement, c p + r: under the V the microbatch comes back up "
          "the ranks, so rank r's chunk 1 is stage 2p - 1 - r (rank 0 holds the first and the "
          "last stage)")


def _stages(v_stage_of: Callable) -> None:
    for p in (1, 2, 3, 4, 5, 8):
        for r in range(p):
            for c in (0, 1):
                got = harness.call_learner(f"v_stage_of({r}, {c}, {p})", v_stage_of, r, c, p,
                                           refuse=STAGE_REFUSED, refusal=REFUSAL)
                want = r if c == 0 else 2 * p - 1 - r
                if got != want:
                    hint = (LOOPED if got == c * p + r else
                            "stages are numbered 0 .. 2p - 1: the last one, 2p - 1, is rank "
                            "0's chunk 1" if got == 2 * p - r else
                            "chunk 0 of rank r is stage r; chunk 1 is stage 2p - 1 - r")
                    fail(f"v_stage_of({r}, {c}, {p}) = {got!r}, expected {want}", hint=hint)


def _warmup_hint(got: Sequence[Any], r: int, p: int) -> str | None:
    """When the first difference is about how many forwards of chunk 0 come before the first
    F1 (phases 1 and 2), the count of each, and which loop sets it."""
    ones = [i for i, a in enumerate(got) if (getattr(a, "kind", None), getattr(a, "chunk", None))
            == ("F", 1)]
    before = got[:ones[0]] if ones else got
    n = sum(1 for a in before if (getattr(a, "kind", None), getattr(a, "chunk", None)) == ("F", 0))
    want = 2 * (p - r - 1) + 1
    if n == want:
        return None
    return (f"rank {r} runs {n} forwards of chunk 0 before its first F1, DualPipe-V "
            f"{want}: phase 1's 2(p - r - 1) = {want - 1} (here p = {p}, r = {r}), then phase "
            "2's first F0")


def _phase_hint(phases: Sequence[int], i: int) -> str:
    """What the comparison establishes about a first difference at position i: inside a
    phase, that phase is off; where one phase ends and the next begins, the first may have
    run too long, a phase with no actions for this rank may have run, or the next may start
    wrong, so all of them are named."""
    if not i or phases[i] == phases[i - 1]:
        return PHASE_HINTS[phases[i]]
    named = range(phases[i - 1], phases[i] + 1)
    empty = list(named[1:-1])
    return (f"position {i} is where phase {phases[i - 1]} ends and phase {phases[i]} begins"
            + (f" (phase {', '.join(map(str, empty))} has no actions here)" if empty else "")
            + ": " + "; ".join(PHASE_HINTS[k] for k in named))


def _first_difference(got: Sequence[Any], want: Sequence[Any], r: int, p: int, m: int
                      ) -> tuple[str, str] | None:
    phases = dualpipe.dualpipe_v_phases(r, p, m)
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            warmup = _warmup_hint(got, r, p) if phases[i] <= 2 else None
            return (f"rank {r}, position {i}: expected {b}, got {a} (phase {phases[i]} of the "
                    "order)", warmup or _phase_hint(phases, i))
    if len(got) != len(want):
        i = min(len(got), len(want))
        phase = phases[min(i, len(phases) - 1)]
        return (f"rank {r} has {len(got)} actions, expected {len(want)} (6m = {6 * m}: F, B "
                f"and W of every micro-batch on both chunks)", PHASE_HINTS[phase])
    return None


def _order(order: Callable, r: int, p: int, m: int) -> list[Any]:
    """The learner's order of rank r, or a failure saying what was expected."""
    where = f"dualpipe_v_order({r}, {p}, {m})"
    got = harness.call_learner(where, order, r, p, m, refuse=ORDER_REFUSED, refusal=REFUSAL)
    if not isinstance(got, (list, tuple)):
        fail(f"{where} returned {type(got).__name__}, expected the list of rank {r}'s "
             "Actions", hint="return one rank's list: [Action('F', 0), ...]")
    bad = next((a for a in got if not isinstance(a, pp.Action)), None)
    if bad is not None:
        fail(f"{where} holds {bad!r}, not an Action",
             hint='build actions as Action("F", i, c), Action("B", i, c), Action("W", i, c)')
    return list(got)


def _one_case(order: Callable, p: int, m: int) -> None:
    where = f"dualpipe_v_order(r, p={p}, m={m})"
    sched = [_order(order, r, p, m) for r in range(p)]
    want = pp.make_schedule("dualpipe_v", p, m)
    try:
        validate(sched, placement="v")
    except pp.ScheduleError as err:
        r = next((r for r in range(p) if sched[r] != want[r]), 0)
        diff = _first_difference(sched[r], want[r], r, p, m)
        # the first difference names this case's m; the simulator's error would infer its own
        fail(f"{where} cannot run under the V placement: {diff[0] if diff else err}",
             hint=diff[1] if diff else "every rank runs F, B and W of every micro-batch on "
             "both chunks once, each B after its F and each W after its B")
    sim = simulate(sched, 2.0, 2.0, 2.0, placement="v")
    for r, peak in enumerate(sim.peak_activations):
        if peak * 2 > 2 * p + 1:
            fail(f"{where}: rank {r} holds {peak * 2:g} chunk-micro-batches at once, "
                 f"DualPipe-V at most 2p + 1 = {2 * p + 1}",
                 hint="a forward too early, or a backward or W too late: " + PHASE_HINTS[4])
    for r in range(p):
        diff = _first_difference(sched[r], want[r], r, p, m)
        if diff:
            fail(f"{where} runs, but its order is not DualPipe-V's: {diff[0]}", hint=diff[1])


def _chunk_layers(v_stage_of: Callable, rank: int, n_layers: int, p: int, v: int
                  ) -> list[list[int]]:
    k = n_layers // (2 * p)
    return [list(range(v_stage_of(rank, c, p) * k, (v_stage_of(rank, c, p) + 1) * k))
            for c in (0, 1)]


def _rank_worker(schedule: list, opts: dict[str, Any], layers_of: Callable) -> dict:
    from parlab.pp.run import pipeline_worker

    harness.refuse_in_rank([pp.stage_of, pp.rank_and_chunk, dualpipe.dualpipe_v,
                            dualpipe.dualpipe_v_rank], REFUSAL)
    return pipeline_worker(schedule, None, {**model_options(opts), "placement": "v"},
                           layers_of)


@harness.exercise("04.dualpipe_v")
def check_dualpipe_v(v_stage_of: Callable, dualpipe_v_order: Callable, *, world_size: int = 2,
                     timeout: float = harness.CHECK_TIMEOUT_S, quiet: bool = False,
                     cases: Sequence[tuple[int, int]] = ORDER_CASES) -> None:
    """Exercise 4: the V placement, one rank's order for several (p, m), then real ranks."""
    harness.not_reexport(v_stage_of, name="v_stage_of")
    harness.not_reexport(dualpipe_v_order, name="dualpipe_v_order")
    _stages(v_stage_of)
    for p, m in cases:
        _one_case(dualpipe_v_order, p, m)
    p, m = world_size, 2 * world_size + 1
    opts = {"n_layers": 6 * p, "width": 16, "batch": 2 * m, "seed": 0, "m": m}
    schedule = [_order(dualpipe_v_order, r, p, m) for r in range(p)]
    results = harness.run_checked(_rank_worker, p, schedule, opts,
                                  functools.partial(_chunk_layers, v_stage_of),
                                  what="DualPipe-V with your order and placement", timeout=timeout,
                                  hang_hint=HANG, backend="gloo")
    compare([{"loss": res["loss"], "grads": res["grads"]} for res in results], "dualpipe_v",
            opts, loss_rank=0)
    if not quiet:
        sim = simulate(pp.make_schedule("dualpipe_v", p, m), 2.0, 2.0, 2.0, t_fb=6.0)
        print(f"DualPipe-V OK: v_stage_of by formula; your order equals DualPipe-V's on "
              f"{len(cases)} (p, m) pairs; on {p} ranks (m = {m}, {opts['n_layers']} layers in "
              f"{2 * p} stages) it matches one device. Simulated with F = B = W per chunk and "
              f"pairs that gain nothing: last rank idle {sim.idle[-1]:g} = (p - 1)(F&B + B - "
              f"3W), peak {2 * p + 1} chunk-micro-batches per rank; point-to-point sends per "
              f"rank {[res['sends'] for res in results]}")
