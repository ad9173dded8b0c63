r"""Time a pipeline schedule: makespan, bubble and peak activations per rank.

Every action starts as soon as its rank is free and its inputs exist (plus a point-to-point
`latency` when they come from another rank); each rank keeps its list order. Costs are for a
rank's whole share of layers, so one chunk of a v-chunk schedule costs 1/v of them:

    F: t_f / v      B: t_b / v (t_b + t_w when the schedule has no W: B does both)      W: t_w / v

`stage_costs` (one multiplier per stage, length p*v) models unbalanced stages.

Overlapped units (DualPipe-V's F&B pairs, `parlab.pp.overlapped_units`): with `t_fb` given,
each runs as one unit of t_fb / v, a rank's whole-share forward-and-backward run at once, as
a GPU does on two streams (t_fb = t_f + t_b + t_w is no gain; with stage_costs the unit keeps
the share t_fb / (t_f + t_b + t_w) of its actions' scaled costs). Without t_fb they run one
after the other, as the CPU executor does. A rank's busy time is the union of its spans.

With T the makespan and busy_r the work of rank r:

    bubble_fraction = 1 - sum_r busy_r / (p T)             share of the step: GPipe's
                                                           accounting (arXiv:1811.06965)
    bubble_ratio    = sum_r (T - busy_r) / sum_r busy_r    idle against useful time:
                                                           Megatron's "bubble time fraction"
                                                           (Narayanan et al., arXiv:2104.04473)

GPipe and 1F1B with zero latency: T = (m + p - 1)(t_f + t_b), so the fraction is
$\frac{p-1}{m+p-1}$ and the ratio $\frac{p-1}{m}$.

Peak activations count the microbatches a rank holds (from F until B frees them, or W when
the backward is split), in units of the rank's full share: a chunk holds 1/v of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from parlab.pp.actions import Action, Schedule, placed_stage, placement_of
from parlab.pp.order import run_in_order, validate
from parlab.pp.schedules import shape_of

__all__ = ["Span", "SimResult", "simulate", "timeline_stats", "action_cost", "stage_times",
           "balance_stages"]


@dataclass(frozen=True)
class Span:
    """One action as it ran (or would run): rank, action, start and end in seconds."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass
class SimResult:
    """A simulated (or measured) run of a schedule; times in the units of the costs."""

    spans: list[list[Span]]  # per rank, in the order run
    makespan: float
    busy: list[float]  # per rank
    bubble_fraction: float
    bubble_ratio: float
    peak_activations: list[float]  # per rank, in microbatches of that rank's layers
    p: int = 0
    m: int = 0
    v: int = 1
    costs: dict = field(default_factory=dict)

    @property
    def idle(self) -> list[float]:
        return [self.makespan - b for b in self.busy]


def action_cost(a: Action, *, v: int, split: bool, t_f: float, t_b: float,
                t_w: float) -> float:
    """Seconds (or units) one action takes on one chunk; see the module docstring."""
    if a.kind == "F":
        return t_f / v
    if a.kind == "B":
        return (t_b if split else t_b + t_w) / v
    return t_w / v


def peak_held(spans: Sequence[Span], *, v: int, split: bool) -> float:
    """Most microbatches held at once by one rank, in units of its full share (chunk = 1/v)."""
    held = peak = 0
    for s in sorted(spans, key=lambda s: (s.start, s.end)):
        if s.action.kind == "F":
            held += 1
        elif s.action.kind == ("W" if split else "B"):
            held -= 1
        peak = max(peak, held)
    return peak / v


def _covered(row: Sequence[Span]) -> float:
    """Time covered by at least one span (overlapped units count once)."""
    total, reach = 0.0, float("-inf")
    for s in sorted(row, key=lambda s: s.start):
        if s.end > reach:
            total += s.end - max(s.start, reach)
            reach = s.end
    return total


def timeline_stats(spans: list[list[Span]], *, v: int = 1,
                   split: bool | None = None) -> tuple[float, list[float], float, float,
                                                       list[float]]:
    """(makespan, busy per rank, bubble fraction, bubble ratio, peak activations) of any
    timeline, simulated or measured; time starts at the earliest start."""
    flat = [s for row in spans for s in row]
    if split is None:
        split = any(s.action.kind == "W" for s in flat)
    t0 = min(s.start for s in flat)
    makespan = max(s.end for s in flat) - t0
    busy = [_covered(row) for row in spans]
    work = sum(busy)
    fraction = 1 - work / (len(spans) * makespan)
    ratio = (len(spans) * makespan - work) / work
    peaks = [peak_held(row, v=v, split=split) for row in spans]
    return makespan, busy, fraction, ratio, peaks


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_w: float = 0.0, *,
             latency: float = 0.0, stage_costs: Sequence[float] | None = None,
             t_fb: float | None = None, placement: str | None = None) -> SimResult:
    """Run `schedule` on a model of time; see the module docstring for the costs.

    t_fb: a rank's whole-share forward and backward run overlapped, for the schedule's
    overlapped units (None: one after the other). placement: "looped" or "v"; default the
    schedule's own."""
    for name, value in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w), ("latency", latency),
                        ("t_fb", 0.0 if t_fb is None else t_fb)):
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    placement = placement or placement_of(schedule)
    validate(schedule, placement=placement)
    p, m, v, split = shape_of(schedule)
    if t_f + t_b + t_w <= 0:
        raise ValueError("t_f + t_b + t_w must be > 0: a step with no work has no bubble")
    scale = [1.0] * (p * v) if stage_costs is None else [float(x) for x in stage_costs]
    if len(scale) != p * v or min(scale) <= 0:
        raise ValueError(f"stage_costs needs {p * v} positive multipliers (one per stage), "
                         f"got {stage_costs!r}")

    def duration(r: int, a: Action) -> float:
        base = action_cost(a, v=v, split=split, t_f=t_f, t_b=t_b, t_w=t_w)
        return base * scale[placed_stage(r, a.chunk, p, placement)]

    def fused(r: int, unit: Sequence[Action]) -> float:
        assert t_fb is not None
        return t_fb / (t_f + t_b + t_w) * sum(duration(r, a) for a in unit)

    raw = run_in_order(schedule, duration, latency=latency, placement=placement,
                       fused=None if t_fb is None else fused)
    spans = [[Span(r, a, s, e) for a, s, e in row] for r, row in enumerate(raw)]
    makespan, busy, fraction, ratio, peaks = timeline_stats(spans, v=v, split=split)
    return SimResult(spans, makespan, busy, fraction, ratio, peaks, p, m, v,
                     {"t_f": t_f, "t_b": t_b, "t_w": t_w, "latency": latency, "t_fb": t_fb})


# --- unbalanced stages ---------------------------------------------------------------------------

def stage_times(layer_costs: Sequence[float], counts: Sequence[int]) -> list[float]:
    """Cost of each stage when stage k takes the next counts[k] layers, in order."""
    out, i = [], 0
    for n in counts:
        out.append(float(sum(layer_costs[i:i + n])))
        i += n
    return out


def balance_stages(layer_costs: Sequence[float], p: int) -> list[int]:
    r"""Layers per stage (consecutive, at least one each) that minimise the slowest stage.

    The first stage must hold layer 0 (the embedding) and the last the final layer (the LM
    head), so only the cut points move. Dynamic programme over prefixes: best[k][j] = the
    smallest possible slowest stage when the first j layers form k stages,
    $\min_i \max(best[k-1][i], \sum_{i \le l < j} c_l)$; O(n^2 p)."""
    n = len(layer_costs)
    if not 1 <= p <= n:
        raise ValueError(f"cannot split {n} layers into {p} non-empty stages")
    prefix = [0.0]
    for c in layer_costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(p + 1)]
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for k in range(1, p + 1):
        for j in range(k, n - (p - k) + 1):
            for i in range(k - 1, j):
                slowest = max(best[k - 1][i], prefix[j] - prefix[i])
                if slowest < best[k][j]:
                    best[k][j], cut[k][j] = slowest, i
    counts, j = [], n
    for k in range(p, 0, -1):
        counts.append(j - cut[k][j])
        j = cut[k][j]
    return counts[::-1]
