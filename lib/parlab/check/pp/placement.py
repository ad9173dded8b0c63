r"""Exercise 3 of module 04, `check_placement(stage_of, layers_of)`: the looped placement.

stage_of(r, c, p) = c p + r, and the layers of each chunk, for several (p, v) by closed form
(a layers_of answer must be a list of v lists of ints); then interleaved 1F1B (v = 2, m = 3p
microbatches, 6p layers: sizes in `parlab.check.pp.common`) runs on world_size ranks in
parlab's executor with the model split by the learner's layers_of, and must match the
single-device gradients (float64, rtol 1e-9). parlab's `stage_of` is refused while the
learner's functions run.

This check stands on its own: the executor is parlab's (the learner's exercise-2 steps know
one chunk per rank), so a mistake in exercises 1 or 2 does not reach it.

A right answer must not depend on p, v, the rank or the layers per stage: the closed forms,
visible, run p = 1 to 8, v = 1 to 5 and 1 to 5 layers per stage, for every rank; the run on
ranks (2 visible, 3 and 4 hidden) only confirms that the split executes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import parlab.check._harness as harness
from parlab.check._compare import fail
from parlab.check.pp.common import HANG, compare, model_options, options
from parlab.pp import schedules as pp

__all__ = ["check_placement"]

CONTIGUOUS = ("that is contiguous placement (rank r holds stages r v, ..., r v + v - 1): a "
              "microbatch then crosses ranks only p - 1 times and meets each rank's chunks "
              "back to back, so the bubble does not shrink. Looped placement gives rank r the "
              "stages r, r + p, r + 2p, ...")
STAGE_CASES = ((1, 2), (2, 2), (3, 2), (4, 2), (4, 3), (8, 4), (4, 1), (3, 5))
LAYER_CASES = ((2, 2, 1), (2, 2, 3), (4, 2, 1), (3, 3, 2), (4, 1, 2), (1, 3, 1), (3, 2, 5))


def _layers_hint(got: Any, r: int, n: int, p: int, v: int) -> str:
    k = n // (p * v)
    contiguous = [list(range((r * v + c) * k, (r * v + c + 1) * k)) for c in range(v)]
    if got == contiguous:
        return CONTIGUOUS
    return (f"chunk c of rank r is stage s = c p + r, which holds the n_layers / (p v) = {k} "
            f"consecutive layers s*{k} ... s*{k} + {k - 1}; return one list per chunk, chunk 0 "
            "first")


def _as_chunks(got: Any, where: str, v: int) -> list[list[int]]:
    """The answer as v lists of ints, or a failure saying what was expected."""
    expected = f"a list of v = {v} lists of layer indices (one per chunk, chunk 0 first)"
    if not isinstance(got, (list, tuple)):
        fail(f"{where} returned {type(got).__name__} ({got!r:.60}), expected {expected}",
             hint="return [[layers of chunk 0], [layers of chunk 1], ...]")
    bad = next((x for x in got if not isinstance(x, (list, tuple, range))), None)
    if bad is not None:
        fail(f"{where} returned {list(got)!r:.80}, expected {expected}: an entry is "
             f"{type(bad).__name__} ({bad!r:.20}), not a list",
             hint="return one list per chunk, even when a chunk holds one layer: "
                  "[[0], [2]], not [0, 2]")
    return [list(x) for x in got]


def _closed_forms(stage_of: Callable, layers_of: Callable) -> None:
    for p, v in STAGE_CASES:
        for r in range(p):
            for c in range(v):
                got = harness.call_learner(f"stage_of({r}, {c}, {p})", stage_of, r, c, p,
                                           refuse=[pp.stage_of], refusal="parlab.pp.stage_of")
                if got != c * p + r:
                    fail(f"stage_of({r}, {c}, {p}) = {got!r} (v = {v}), expected c p + r = "
                         f"{c * p + r}", hint=CONTIGUOUS if got == r * v + c else
                         "chunk c of rank r is stage c p + r")
    for p, v, k in LAYER_CASES:
        n = p * v * k
        for r in range(p):
            where = f"layers_of({r}, n_layers={n}, p={p}, v={v})"
            got = _as_chunks(harness.call_learner(where, layers_of, r, n, p, v,
                                                  refuse=[pp.stage_of],
                                                  refusal="parlab.pp.stage_of"), where, v)
            want = [list(range((c * p + r) * k, (c * p + r + 1) * k)) for c in range(v)]
            if got != want:
                fail(f"{where} = {got}, expected {want}", hint=_layers_hint(got, r, n, p, v))


def _placement_worker(schedule: pp.Schedule, opts: dict[str, Any], layers_of: Callable) -> dict:
    from parlab.pp.run import pipeline_worker

    harness.refuse_in_rank([pp.stage_of], "parlab.pp.stage_of")
    return pipeline_worker(schedule, None, model_options(opts), layers_of)


@harness.exercise("04.placement")
def check_placement(stage_of: Callable, layers_of: Callable, *, world_size: int = 2,
                    timeout: float = harness.CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 3: looped placement by formula, then an interleaved run on real ranks."""
    harness.not_reexport(stage_of, name="stage_of")
    harness.not_reexport(layers_of, name="layers_of")
    _closed_forms(stage_of, layers_of)
    opts = options(world_size, v=2)
    schedule = pp.make_schedule("interleaved_1f1b", world_size, opts["m"], 2)
    results = harness.run_checked(_placement_worker, world_size, schedule, opts, layers_of,
                                  what="interleaved 1F1B with your layers_of", timeout=timeout,
                                  hang_hint=HANG, backend="gloo")
    compare([{"loss": res["loss"], "grads": res["grads"]} for res in results],
            "interleaved_1f1b", opts)
    if not quiet:
        print(f"placement OK: stage_of and layers_of by formula; interleaved 1F1B (v = 2, "
              f"m = {opts['m']}, {opts['n_layers']} layers) on {world_size} ranks with your "
              f"split matches one device; point-to-point sends per rank "
              f"{[res['sends'] for res in results]}")
