"""The pipeline bubble measured from profiler traces, beside the simulator and the closed form.

    make bench        or        .venv/bin/python benchmarks/bench_bubble.py [--repeats 3]

On p = 4 gloo ranks (parlab.launch.run with trace=) the executor runs 1F1B, interleaved 1F1B
(v = 2) and ZB-H1 for m = 4, 8, 16, 32 micro-batches, each action sleeping out t_f = t_b =
t_w = 5 ms (`parlab.pp.measure.measure_bubbles`, one traced job per schedule and repeat).
From each trace: the bubble (the idle share of the F/B/W ranges, GPipe's accounting) and what
a message costs in flight (a consumer's start minus its producer's end, where it was already
waiting); per run `simulate` with latency 0, with that latency and with the one latency
fitted to all runs, and the closed form ((p-1)/(vm+p-1); ZB-H1: (p-1)(t_f+t_b-t_w) idle per
rank). Measured values are medians over the repeats; step is the run's traced makespan; peak
RSS is each rank's resident memory at its highest (the whole process: torch itself included).

First each closed form must equal the simulator without latency (to 1e-9): the table compares
models that agree. TORCH_DISTRIBUTED_DEBUG is OFF (see `_table.no_debug_checks`).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _table import Table, repeats_option, setting

from parlab.pp.measure import SCHEDULES, BubbleSweep, fitted_latency, measure_bubbles
from parlab.pp.simulator import simulate

P, MS, COSTS = 4, (4, 8, 16, 32), (0.005, 0.005, 0.005)


def sweeps(repeats: int, folder: Path) -> dict[str, list[BubbleSweep]]:
    """Per schedule, `repeats` traced jobs, in turns (schedule after schedule, repeat after
    repeat), so that a slow spell of the machine hits every schedule alike."""
    out: dict[str, list[BubbleSweep]] = {name: [] for name, _ in SCHEDULES}
    for i in range(repeats):
        for name, v in SCHEDULES:
            trace = folder / f"{name}-{i}.json"
            out[name].append(measure_bubbles(p=P, ms=MS, schedules=[(name, v)], costs=COSTS,
                                             trace=trace))
            trace.unlink()
    return out


def main() -> None:
    repeats = repeats_option(__doc__, default=3, debug_checks=False)
    with tempfile.TemporaryDirectory(prefix="bench-bubble-") as folder:
        runs = sweeps(repeats, Path(folder))
    latency = statistics.median(s.latency for rs in runs.values() for s in rs)
    measured = {(r.config.name, r.config.m): statistics.median(
        s.row(r.config.name, r.config.m).measured for s in runs[r.config.name])
        for rs in runs.values() for r in rs[0].rows}
    configs = [r.config for rs in runs.values() for r in rs[0].rows]
    fit = fitted_latency([(c, measured[c.name, c.m]) for c in configs], COSTS)
    table = Table(setting(f"Pipeline bubble on p={P} ranks, t_f = t_b = t_w = 5 ms per rank's "
                          f"share; a message {latency * 1e3:.2f} ms in flight (measured), "
                          f"{fit * 1e3:.2f} ms fitted", repeats),
                  ["schedule", "m", "closed form", "simulate", "simulate, measured latency",
                   "simulate, fitted latency", "measured", "step ms", "peak RSS MiB per rank"])
    for c in configs:
        first = runs[c.name][0].row(c.name, c.m)
        assert abs(first.formula - first.simulated) < 1e-9, (c, first)
        step = statistics.median(s.row(c.name, c.m).makespan for s in runs[c.name])
        rss = [max(s.peak_rss[k] for s in runs[c.name]) >> 20 for k in range(P)]
        table.add(c.name, c.m, f"{first.formula:.1%}", f"{first.simulated:.1%}",
                  f"{simulate(c.schedule(), *COSTS, latency=latency).bubble_fraction:.1%}",
                  f"{simulate(c.schedule(), *COSTS, latency=fit).bubble_fraction:.1%}",
                  f"{measured[c.name, c.m]:.1%}", f"{step * 1e3:.0f}",
                  "/".join(map(str, rss)))
    table.emit("bubble")


if __name__ == "__main__":
    main()
