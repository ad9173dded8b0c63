r"""The bubble measured from a profiler trace, beside the simulator and the closed form.

    from parlab.pp.measure import measure_bubbles
    sweep = measure_bubbles(ms=(4, 8, 16, 32), trace="pipeline.json")
    sweep.rows            # one per (schedule, m): measured, simulated, formula
    sweep.latency         # what a message costs, read off the trace, seconds

All the schedules run in one job on p ranks over gloo, with CPU tensors, also on a GPU box
(`parlab.launch.run(..., trace=path, backend="gloo")`: the executor posts its receives ahead
of its sends, which NCCL would run in that order, `parlab.pp.run`), one after
the other, each inside a range named "pipeline <schedule> m=<m>" (`config_name`) whose actions
are the executor's ranges ("F mb3 chunk1", `parlab.pp.executor.range_name`). Each action
sleeps out a known cost (`execute(costs=...)`), so the timeline is set by those costs and by
what the machine adds, not by how fast the CPU runs the toy layers.

Per run, from the trace:

- measured bubble: `parlab.timeline.idle_share` over the F/B/W ranges inside its window, the
  idle share of p ranks × (first start to last end), GPipe's accounting;
- what each message cost (`message_costs`), two ways. In flight: where the consumer was
  already waiting (its "recv ..." range had started before the producer's action ended), the
  consumer's start minus the producer's end: posting, the transfer, waking the receiver.
  Handling: where the message was sent before the consumer began to wait for it, the length
  of that "recv ..." range, the time it takes to take in a message that is already there.
  Posting: the length of the producer's "send ..." range, paid after its action, before the
  next.

Beside it `simulate` with the same costs: with latency 0; with `latency` = the median
in-flight cost; and with `fitted_latency`, the one latency at which the simulated bubbles
match the measured ones on average (the simulator's latency delays a message's arrival; it
does not charge posting and handling, which a rank pays on every message whether or not it
waits; a fitted latency stands in for all three, and for the occasional millisecond a rank
spends waiting for a CPU core). And the closed
form: $\frac{p-1}{vm+p-1}$ (`parlab.costs.bubble_fraction`) for 1F1B (v = 1) and interleaved
1F1B, and for ZB-H1 Qi et al.'s idle time $(p-1)(t_f + t_b - t_w)$ per rank
(arXiv:2401.10241) against $m(t_f + t_b + t_w)$ of work.
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
from parlab.pp.order import dependencies
from parlab.pp.schedules import Schedule, make_schedule
from parlab.pp.simulator import SimResult, Span, simulate, timeline_stats
from parlab.timeline import Timeline, idle_share, load

__all__ = ["SCHEDULES", "Config", "BubbleRow", "BubbleSweep", "config_name", "formula_bubble",
           "windows", "message_costs", "trace_result", "fitted_latency", "measure_bubbles"]

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
    """The closed form of the idle share (module docstring). ZB-H1's holds for m >= p, the
    paper's setting: with fewer micro-batches its steady phase never fills."""
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
    simulated_latency: float  # simulate(latency=the sweep's measured in-flight cost)
    simulated_fitted: float  # simulate(latency=the sweep's fitted latency)
    formula: float
    makespan: float  # seconds, from the trace
    in_flight: list[float] = field(default_factory=list)  # seconds, per waited-for message
    handling: list[float] = field(default_factory=list)  # seconds, per early message


@dataclass
class BubbleSweep:
    """`measure_bubbles`' result; `trace` is the merged file when one was asked for."""

    rows: list[BubbleRow]
    costs: tuple[float, float, float]
    latency: float  # median in-flight cost of a message, seconds
    handling: float  # median handling cost of a message that was already there
    posting: float  # median length of a "send ..." range
    fitted_latency: float
    trace: str | None = None
    timeline: Timeline | None = None
    peak_rss: list[int] = field(default_factory=list)  # bytes, per rank (its whole life)

    def row(self, name: str, m: int) -> BubbleRow:
        return next(r for r in self.rows if r.config.name == name and r.config.m == m)


def windows(tl: Timeline) -> dict[str, tuple[float, float]]:
    """Every run's window in the trace: {config_name: (start, end)}, in one pass."""
    out: dict[str, tuple[float, float]] = {}
    for r in tl.ranges(prefix="pipeline "):
        start, end = out.get(r.name, (r.start, r.end))
        out[r.name] = (min(start, r.start), max(end, r.end))
    return out


def _window(tl: Timeline, config: Config,
            window: tuple[float, float] | None) -> tuple[float, float]:
    return tl.span(config_name(config)) if window is None else window


def trace_result(tl: Timeline, config: Config, *,
                 window: tuple[float, float] | None = None) -> SimResult:
    """One run's actions, read back from the trace, as a SimResult (times from its first
    start): what `parlab.pp.plot_timeline` draws and `timeline_stats` measures. window: the
    run's (start, end), found by its name when not given."""
    window = _window(tl, config, window)
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


def message_costs(tl: Timeline, config: Config, *, window: tuple[float, float] | None = None
                  ) -> tuple[list[float], list[float]]:
    """(in flight, handling) in seconds, one entry per cross-rank message (module docstring)."""
    window = _window(tl, config, window)
    where: dict[tuple[int, str], tuple[float, float]] = {}
    for r in tl.ranges(prefix=WORK + ("recv ",), within=window):
        where[(r.rank, r.name)] = (r.start, r.end)
    flight, handling = [], []
    for rank, actions in enumerate(config.schedule()):
        for a in actions:
            waited = where.get((rank, f"recv {range_name(a)}"))
            started = where.get((rank, range_name(a)))
            sent = [where.get((q, range_name(dep)))
                    for q, dep in dependencies(a, rank, config.p, config.v) if q != rank]
            if waited is None or started is None or not sent or any(x is None for x in sent):
                continue
            produced = max(x[1] for x in sent if x is not None)
            if waited[0] < produced:  # already waiting when the message left
                flight.append(started[0] - produced)
            else:
                handling.append(waited[1] - waited[0])
    return flight, handling


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
    rss = launch.run(_sweep_worker, p, configs, costs, options, trace=trace, timeout=timeout,
                     backend="gloo")  # the executor posts receives ahead: a gloo design
    tl = load(trace)
    found = windows(tl)
    window = {c: found[config_name(c)] for c in configs}
    spent = {c: message_costs(tl, c, window=window[c]) for c in configs}
    latency, handling = (_median([g for c in configs for g in spent[c][k]]) for k in (0, 1))
    measured = {c: idle_share(tl, WORK, within=window[c]) for c in configs}
    fit = fitted_latency(list(measured.items()), costs)
    posting = _median([r.seconds for c in configs
                       for r in tl.ranges(prefix="send ", within=window[c])])
    rows = []
    for c in configs:
        start, end = tl.span(WORK, within=window[c])
        zero, at_latency, at_fit = (simulate(c.schedule(), *costs, latency=x).bubble_fraction
                                    for x in (0.0, latency, fit))
        rows.append(BubbleRow(c, measured[c], zero, at_latency, at_fit,
                              formula_bubble(c, *costs), end - start, *spent[c]))
    return BubbleSweep(rows, costs, latency, handling, posting, fit, str(trace), tl, rss)


def _median(values: list[float]) -> float:
    return max(0.0, statistics.median(values)) if values else 0.0

