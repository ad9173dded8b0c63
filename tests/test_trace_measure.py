"""parlab.pp.measure on traces written by hand from the simulator (no ranks, fast).

The references are independent of the code under test: the simulator's own timeline (a
trace made from it must read back as the same bubble, its messages as the latency it was
given), and the closed forms against the simulator's engine."""

from __future__ import annotations

import pytest

from parlab.pp import dependencies, make_schedule, simulate
from parlab.pp.executor import range_name
from parlab.pp.measure import (
    Config,
    config_name,
    fitted_latency,
    formula_bubble,
    message_costs,
    trace_result,
)
from parlab.timeline import Timeline

COSTS = (1.0, 2.0, 1.0)  # units: the trace's times are these read as seconds


def _trace(config: Config, latency: float) -> Timeline:
    """The simulated run as a merged trace: action ranges, "recv" ranges where a rank waits
    for a message, and the run's window, as parlab.pp.measure's sweep writes them."""
    sim = simulate(config.schedule(), *COSTS, latency=latency)
    events = []

    def add(rank: int, name: str, start: float, end: float) -> None:
        events.append({"ph": "X", "pid": rank, "tid": 0, "name": name, "ts": start * 1e6,
                       "dur": (end - start) * 1e6})

    for rank, row in enumerate(sim.spans):
        add(rank, config_name(config), 0.0, sim.makespan)
        free = 0.0
        for s in row:
            add(rank, range_name(s.action), s.start, s.end)
            if any(q != rank for q, _ in dependencies(s.action, rank, config.p, config.v)):
                add(rank, f"recv {range_name(s.action)}", free, s.start)
            free = s.end
        events.append({"ph": "M", "name": "process_name", "pid": rank,
                       "args": {"name": f"rank {rank}"}})
    return Timeline({"traceEvents": events})


CONFIGS = [Config("1f1b", 4, 8), Config("interleaved_1f1b", 4, 8, 2), Config("zb_h1", 3, 5)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_a_trace_reads_back_as_the_timeline_it_was_written_from(config):
    tl = _trace(config, latency=0.25)
    back = trace_result(tl, config)
    want = simulate(config.schedule(), *COSTS, latency=0.25)
    assert back.bubble_fraction == pytest.approx(want.bubble_fraction, abs=1e-9)
    assert back.peak_activations == want.peak_activations


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_a_message_costs_its_latency_in_flight_and_nothing_when_early(config):
    tl = _trace(config, latency=0.25)
    flight, handling = message_costs(tl, config)
    assert flight and all(g == pytest.approx(0.25, abs=1e-6) for g in flight)
    # early messages: the rank found them there, its "recv" range lasted no time at all
    assert handling and all(h == pytest.approx(0.0, abs=1e-6) for h in handling)
    assert len(flight) + len(handling) == sum(
        any(q != r for q, _ in dependencies(a, r, config.p, config.v))
        for r, row in enumerate(config.schedule()) for a in row)


def test_fitted_latency_finds_the_latency_the_bubbles_were_made_with():
    rows = [(c, simulate(c.schedule(), *COSTS, latency=0.3).bubble_fraction) for c in CONFIGS]
    assert fitted_latency(rows, COSTS, high=2.0, steps=30) == pytest.approx(0.3, abs=1e-6)
    exact = [(c, simulate(c.schedule(), *COSTS).bubble_fraction) for c in CONFIGS]
    assert fitted_latency(exact, COSTS) == 0.0


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1)])
@pytest.mark.parametrize("p,m", [(2, 2), (3, 6), (4, 4), (4, 32), (5, 7)])
@pytest.mark.parametrize("costs", [(1, 1, 1), (1, 2, 0.5), (2, 1, 1)])
def test_the_closed_forms_match_the_simulator(name, v, p, m, costs):
    if name == "interleaved_1f1b" and m % p:
        pytest.skip("interleaved 1F1B takes m in multiples of p")
    config = Config(name, p, m, v)
    assert formula_bubble(config, *costs) == pytest.approx(
        simulate(make_schedule(name, p, m, v), *costs).bubble_fraction, abs=1e-9)
