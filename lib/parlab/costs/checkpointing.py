r"""How often to save, and how: the checkpoint interval against the failure rate (module 09).

    checkpoint_overhead(600, mtbf=11_000, save_stall=60, restart=600)   # share of time lost
    young_interval(60, 11_000)                                          # sqrt(2 δ M), seconds
    best_policy(mtbf=11_000, sync_save=60, async_stall=4, async_write=90, restart=600)

The model (Young 1974, with the restart cost as in Daly 2006). Training saves every τ seconds
of work; a save blocks the training loop for δ (the stall); failures arrive at random, on
average one per M seconds (the mean time between failures, MTBF, of the whole job). After a
failure the job pays the restart R (re-launch, reload the checkpoint, warm up) and redoes the
work done since the last checkpoint that is complete on storage. Per second of work:

    overhead(τ) = δ/τ              the stalls: one per interval
                + (τ/2 + w + R)/M  per failure: half an interval redone on average, plus the
                                   time w a snapshot waits before it is on storage, plus R

- a synchronous save (`dcp.save`): the loop waits until every byte is written, δ = the whole
  save and w = 0;
- an asynchronous save (`dcp.async_save`): the loop waits only for the copy of the state to
  host memory (the staging), δ = that copy; the write to storage runs in the background for
  w seconds, and a snapshot is only a checkpoint once written: a failure during the write
  falls back to the checkpoint before, hence w in the lost work. The next save must wait for
  the previous write: with τ < w the loop stalls w - τ more at every save.

Setting d overhead / dτ = -δ/τ² + 1/(2M) = 0 gives Young's interval and its overhead (to
first order in δ/M, which is Young's approximation: the lost work counts no failure during a
save):

    τ* = sqrt(2 δ M),   overhead(τ*) = sqrt(2 δ / M) + (w + R)/M.

R (and w) add the same share whatever τ: they raise the cost of a failure, not the best
interval. An async save's best interval is max(sqrt(2 δ M), w) (the overhead falls while
τ < w, as long as w < 2M). Daly's higher-order interval (`daly_interval`) keeps the terms
Young dropped; it differs from sqrt(2 δ M) by about δ when δ << M.

Units: seconds; overheads are shares of the time spent training (0.05 = 5 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["CHECKPOINT_BYTES_PER_PARAM", "SAVE_MODES", "checkpoint_bytes",
           "checkpoint_overhead", "young_interval", "daly_interval", "optimal_overhead",
           "best_interval", "Policy", "policy_overhead", "best_policy"]

CHECKPOINT_BYTES_PER_PARAM = 2 + 4 + 8
"""What a resumable mixed-precision checkpoint holds per parameter: the bf16 weight (2 B), the
fp32 master weight (4 B) and Adam's two fp32 moments (8 B); not the gradients."""
SAVE_MODES = ("sync", "async")
Mode = Literal["sync", "async"]


def _positive(name: str, value: float, *, zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be a finite number of seconds {'>= 0' if zero else '> 0'}"
                         f", got {value!r}")
    return float(value)


def checkpoint_bytes(n_params: float, *, writers: int = 1,
                     bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM) -> float:
    """Bytes each of `writers` ranks writes when the checkpoint is spread evenly over them
    (DCP writes every piece once, by one of the ranks that hold it)."""
    if writers < 1:
        raise ValueError(f"writers must be >= 1, got {writers}")
    return _positive("n_params", n_params) * bytes_per_param / writers


def checkpoint_overhead(interval: float, *, mtbf: float, save_stall: float,
                        restart: float = 0.0, write: float = 0.0) -> float:
    """The share of training time lost at a save every `interval` seconds: δ/τ + (τ/2 + w +
    R)/M, with the extra wait max(0, w - τ) added to every stall when the background write `w`
    is longer than the interval (w = 0: a synchronous save)."""
    tau, m = _positive("interval", interval), _positive("mtbf", mtbf)
    delta, r = _positive("save_stall", save_stall, zero=True), _positive("restart", restart,
                                                                         zero=True)
    w = _positive("write", write, zero=True)
    stall = delta + max(0.0, w - tau)  # waits for the previous background write first
    return stall / tau + (tau / 2 + w + r) / m


def young_interval(save_stall: float, mtbf: float) -> float:
    """Young's interval sqrt(2 δ M), seconds (Young 1974)."""
    return math.sqrt(2 * _positive("save_stall", save_stall) * _positive("mtbf", mtbf))


def daly_interval(save_stall: float, mtbf: float) -> float:
    """Daly's higher-order interval (Daly 2006): sqrt(2δM)(1 + sqrt(δ/2M)/3 + δ/(18M)) - δ for
    δ < 2M, else M."""
    delta, m = _positive("save_stall", save_stall), _positive("mtbf", mtbf)
    if delta >= 2 * m:
        return m
    x = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def optimal_overhead(save_stall: float, mtbf: float, *, restart: float = 0.0) -> float:
    """The overhead at Young's interval: sqrt(2δ/M) + R/M (a synchronous save)."""
    m = _positive("mtbf", mtbf)
    return math.sqrt(2 * _positive("save_stall", save_stall) / m) + _positive(
        "restart", restart, zero=True) / m


def best_interval(*, mtbf: float, save_stall: float, write: float = 0.0) -> float:
    """The interval that minimises `checkpoint_overhead`: sqrt(2δM), or w when the background
    write is longer (then the loop would wait for it), or, past w > 2M, sqrt(2M(δ + w))."""
    m, delta = _positive("mtbf", mtbf), _positive("save_stall", save_stall)
    w = _positive("write", write, zero=True)
    above = max(math.sqrt(2 * delta * m), w)  # the best with τ >= w (no wait)
    if w == 0:
        return above
    below = min(math.sqrt(2 * m * (delta + w)), w)  # the best with τ <= w (a wait)
    cost = [checkpoint_overhead(t, mtbf=m, save_stall=delta, write=w) for t in (above, below)]
    return above if cost[0] <= cost[1] else below


@dataclass(frozen=True)
class Policy:
    """A save mode, its interval (seconds of training between saves) and the overhead."""

    mode: Mode
    interval: float
    overhead: float


def policy_overhead(mode: Mode, interval: float, *, mtbf: float, sync_save: float,
                    async_stall: float, async_write: float, restart: float = 0.0) -> float:
    """The overhead of saving in `mode` every `interval` seconds (`checkpoint_overhead` with
    δ = sync_save, w = 0 for "sync"; δ = async_stall, w = async_write for "async")."""
    if mode not in SAVE_MODES:
        raise ValueError(f"mode must be one of {SAVE_MODES}, got {mode!r}")
    if mode == "sync":
        return checkpoint_overhead(interval, mtbf=mtbf, save_stall=sync_save, restart=restart)
    return checkpoint_overhead(interval, mtbf=mtbf, save_stall=async_stall, restart=restart,
                               write=async_write)


def best_policy(*, mtbf: float, sync_save: float, async_stall: float, async_write: float,
                restart: float = 0.0) -> Policy:
    """The mode and interval with the smaller overhead (each at its best interval)."""
    modes: tuple[tuple[Mode, float, float], ...] = (("sync", sync_save, 0.0),
                                                    ("async", async_stall, async_write))
    out = []
    for mode, delta, w in modes:
        tau = best_interval(mtbf=mtbf, save_stall=delta, write=w)
        out.append(Policy(mode, tau, policy_overhead(
            mode, tau, mtbf=mtbf, sync_save=sync_save, async_stall=async_stall,
            async_write=async_write, restart=restart)))
    return min(out, key=lambda p: p.overhead)
