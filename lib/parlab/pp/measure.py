r"""The bubble measured from a profiler trace, beside the simulator and the closed form.

    from parlab.pp.measure import measure_bubbles
    sweep = measure_bubbles(ms=(4, 8, 16, 32), trace="pipeline.json")
    sweep.rows            # one per (schedule, m): measured, simulated, formula
    sweep.latency         # the message latency read off the trace, seconds

All the schedules run in one job on p ranks (`parlab.launch.run(..., trace=path)`), one after
the other, each inside a range named "pipeline <schedule> m=<m>" (`config_name`) whose actions
are the executor's ranges ("F mb3 chunk1", `parlab.pp.executor.range_name`). Each action
sleeps out a known cost (`execute(costs=...)`), so the timeline is set by those costs and by
what the machine adds, not by how fast the CPU runs the toy layers.

Per run, from the trace:

- measured bubble: `parlab.timeline.idle_share` over the F/B/W ranges inside its window, the
  idle share of p ranks × (first start to last end), GPipe's accounting;
- latency: for every message whose consumer was already waiting for it (its "recv ..." range
  had started), the consumer's start minus the producer's end: posting the message, the
  transfer and waking the receiver. The sweep's `latency` is the median over all runs.

Beside it `simulate` with the same costs, with latency 0 and with the measured latency; a
replay (`replay`: the simulator fed each action's duration as the trace measured it, plus the
latency), which adds what the costs leave out, actions that overran them while their rank
waited for a CPU core; the latency that would make the simulation match the measured bubbles
on its own (`fitted_latency`); and the closed form: $\frac{p-1}{vm+p-1}$
(`parlab.costs.bubble_fraction`) for 1F1B (v = 1) and interleaved 1F1B, and for ZB-H1 Qi et
al.'s idle time $(p-1)(t_f + t_b - t_w)$ per rank (arXiv:2401.10241) against
$m(t_f + t_b + t_w)$ of work.
"""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.distributed as dist
from torch.profiler import record_function

from parlab import costs as closed_forms
from parlab import launch
from parlab.pp.executor import execute, make_context, range_name
from parlab.pp.order import dependencies, run_in_order
from parlab.pp.schedules import Schedule, make_schedule
from parlab.pp.simulator import SimResult, Span, simulate, timeline_stats
from parlab.timeline import Timeline, idle_share, load

__all__ = ["SCHEDULES", "Config", "BubbleRow", "BubbleSweep", "config_name", "formula_bubble",
           "message_gaps", "trace_result", "replay", "fitted_latency", "measure_bubbles"]

SCHEDULES = (("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1))  # (name, chunks per rank v)
WORK = ("F ", "B ", "W ")  # the executor's action ranges


@dataclass(frozen=True)
class Config:
    """One run of the sweep: a schedule on p ranks, m microbatches, v chunks per rank."""

    name: str
    p: int
    m: int
    v: int = 1

    def schedule(self) -> Schedule:
        return make_schedule(self.name, self.p, self.m, self.v)


def config_name(config: Config) -> str:
    """The range around one run in the trace: "pipeline interleaved_1f1b m=8"."""
    return f"pipeline {config.name} m={config.m}"


def formula_bubble(config: Config, t_f: float, t_b: float, t_w: float) -> float:
    """The closed form of the idle share (module docstring)."""
    p, m = config.p, config.m
    if config.name == "zb_h1":
        idle = (p - 1) * max(0.0, t_f + t_b - t_w)
        return idle / (m * (t_f + t_b + t_w) + idle)
    return closed_forms.bubble_fraction(p, m, config.v)


@dataclass
class BubbleRow:
    """One run: the bubble three ways, and what the trace says about its messages."""

    config: Config
    measured: float  # idle share from the trace's ranges
    simulated: float  # simulate(), no latency
    simulated_latency: float  # simulate(latency=the sweep's measured latency)
    replayed: float  # the trace's own durations + the measured latency
    formula: float
    makespan: float  # seconds, from the trace
    gaps: list[float] = field(default_factory=list)  # per waited-for message, seconds


@dataclass
class BubbleSweep:
    """`measure_bubbles`' result; `trace` is the merged file when one was asked for."""

    rows: list[BubbleRow]
    costs: tuple[float, float, float]
    latency: float
    fitted_latency: float
    trace: str | None = None
    timeline: Timeline | None = None
    peak_rss: list[int] = field(default_factory=list)  # bytes, per rank (its whole life)

    def row(self, name: str, m: int) -> BubbleRow:
        return next(r for r in self.rows if r.config.name == name and r.config.m == m)


def _window(tl: Timeline, config: Config) -> tuple[float, float]:
    return tl.span(config_name(config))


def trace_result(tl: Timeline, config: Config) -> SimResult:
    """One run's actions, read back from the trace, as a SimResult (times from its first
    start): what `parlab.pp.plot_timeline` draws and `timeline_stats` measures."""
    window = _window(tl, config)
    by_name = {range_name(a): a for row in config.schedule() for a in row}
    spans = [[Span(r.rank, by_name[r.name], r.start, r.end)
              for r in tl.ranges(rank=rank, prefix=WORK, within=window) if r.name in by_name]
             for rank in range(config.p)]
    t0 = min(s.start for row in spans for s in row)
    spans = [[Span(s.rank, s.action, s.start - t0, s.end - t0) for s in row] for row in spans]
    split = any(a.kind == "W" for row in config.schedule() for a in row)
    makespan, busy, fraction, ratio, peaks = timeline_stats(spans, v=config.v, split=split)
    return SimResult(spans, makespan, busy, fraction, ratio, peaks, config.p, config.m,
                     config.v)


def replay(tl: Timeline, config: Config, latency: float) -> float:
    """The bubble of `config` simulated with each action lasting what it lasted in the trace
    (`run_in_order`, the simulator's engine), messages taking `latency` seconds."""
    measured = trace_result(tl, config)
    took = {(s.rank, s.action): s.end - s.start for row in measured.spans for s in row}
    raw = run_in_order(config.schedule(), lambda r, a: took[(r, a)], latency=latency)
    spans = [[Span(r, a, s, e) for a, s, e in row] for r, row in enumerate(raw)]
    return timeline_stats(spans, v=config.v)[2]


def fitted_latency(rows: Sequence[tuple[Config, float]], costs: tuple[float, float, float],
                   *, high: float = 0.02, steps: int = 12) -> float:
    """The one latency at which simulate's bubbles, summed over `rows` ((config, measured
    bubble) pairs), equal the measured ones: bisection, since the bubble grows with it."""
    def excess(latency: float) -> float:
        return sum(simulate(c.schedule(), *costs, latency=latency).bubble_fraction - b
                   for c, b in rows)
    low = 0.0
    if excess(low) >= 0:
        return 0.0
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (mid, high) if excess(mid) < 0 else (low, mid)
    return (low + high) / 2


def message_gaps(tl: Timeline, config: Config) -> list[float]:
    """Consumer start minus producer end, for each message the consumer was waiting for."""
    window = _window(tl, config)
    where: dict[tuple[int, str], tuple[float, float]] = {}
    for r in tl.ranges(prefix=WORK + ("recv ",), within=window):
        where[(r.rank, r.name)] = (r.start, r.end)
    gaps = []
    for rank, actions in enumerate(config.schedule()):
        for a in actions:
            for q, dep in dependencies(a, rank, config.p, config.v):
                waited = where.get((rank, f"recv {range_name(a)}"))
                produced = where.get((q, range_name(dep)))
                started = where.get((rank, range_name(a)))
                if q == rank or waited is None or produced is None or started is None:
                    continue
                if waited[0] < produced[1]:  # already waiting when the message left
                    gaps.append(started[0] - produced[1])
    return gaps


def _sweep_worker(configs: Sequence[Config], costs: tuple[float, float, float],
                  options: dict) -> int:
    """In each rank: every run, one after the other, each inside its named range; returns
    the rank's peak resident memory in bytes (Linux reports kilobytes)."""
    for config in configs:
        ctx, _ = make_context(config.p, config.m, config.v, **options)
        with record_function(config_name(config)):
            execute(config.schedule(), ctx, costs=costs)
        dist.barrier()  # the runs' windows do not overlap
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_bubbles(*, p: int = 4, ms: Sequence[int] = (4, 8, 16, 32),
                    schedules: Sequence[tuple[str, int]] = SCHEDULES,
                    costs: tuple[float, float, float] = (0.005, 0.005, 0.005),
                    trace: str | os.PathLike, n_layers: int = 8, batch: int = 32,
                    timeout: float = 120.0) -> BubbleSweep:
    """Run every (schedule, m) on p ranks in one traced job; see the module docstring.

    costs: (t_f, t_b, t_w) seconds for a rank's whole share (a 1F1B B lasts t_b + t_w);
    batch must split into every m."""
    configs = [Config(name, p, m, v) for name, v in schedules for m in ms]
    options = {"n_layers": n_layers, "width": 16, "batch": batch}
    rss = launch.run(_sweep_worker, p, configs, costs, options, trace=trace, timeout=timeout)
    tl = load(trace)
    gaps = {c: message_gaps(tl, c) for c in configs}
    every = [g for c in configs for g in gaps[c]]
    latency = max(0.0, statistics.median(every)) if every else 0.0
    rows = []
    for c in configs:
        window = _window(tl, c)
        start, end = tl.span(WORK, within=window)
        rows.append(BubbleRow(
            c, idle_share(tl, WORK, within=window), simulate(c.schedule(), *costs).bubble_fraction,
            simulate(c.schedule(), *costs, latency=latency).bubble_fraction,
            replay(tl, c, latency), formula_bubble(c, *costs), end - start, gaps[c]))
    fit = fitted_latency([(r.config, r.measured) for r in rows], costs)
    return BubbleSweep(rows, costs, latency, fit, str(trace), tl, rss)

