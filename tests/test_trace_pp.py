"""A traced pipeline run: every action of a known schedule once, in order, within the run.

`run_pipeline(..., trace=path)` profiles every rank; the test reads the merged file back and
compares it with what it knows independently of the trace: the schedule's own lists (which
actions, in which order, on which rank), its dependencies (`parlab.pp.dependencies`: an
action cannot start before the action on another rank whose output it needs has ended, which
also checks that the rows' clocks are aligned), the costs each action sleeps out, and the
executor's own perf_counter timeline (its makespan and bubble, measured by another clock).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import pytest

from parlab.pp import dependencies, make_schedule, run_pipeline, shape_of
from parlab.pp.executor import range_name
from parlab.pp.simulator import action_cost
from parlab.timeline import CLOCK_SYNC, idle_share, load

COSTS = (0.004, 0.006, 0.003)  # t_f, t_b, t_w: distinct, so a range of the wrong kind shows
CASES = {"zb_h1 on 3 ranks": ("zb_h1", 3, 4, 1, 6),
         "interleaved_1f1b on 2 ranks": ("interleaved_1f1b", 2, 4, 2, 8)}  # ..., layers
ACTIONS = ("F ", "B ", "W ")  # the executor's ranges: "F mb3 chunk1" (range_name)
SLACK = 1e-4  # seconds: the profiler's and perf_counter's readings of one moment


@pytest.fixture(scope="module", params=list(CASES))
def traced(request, tmp_path_factory):
    name, p, m, v, layers = CASES[request.param]
    schedule = make_schedule(name, p, m, v)
    path = tmp_path_factory.mktemp("pp") / "run.json"
    run = run_pipeline(schedule, costs=COSTS, trace=path, n_layers=layers)
    return schedule, run, path


def _nesting_errors(events: list[dict]) -> list[str]:
    """Ranges on one track must nest (Perfetto draws nothing else): partial overlaps."""
    tracks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            tracks[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    errors = []
    for key, ranges in tracks.items():
        open_ = []
        for start, end, name in sorted(ranges, key=lambda r: (r[0], -r[1])):
            while open_ and open_[-1][1] <= start + 1:  # 1 us: the profiler's rounding
                open_.pop()
            if open_ and end > open_[-1][1] + 1:
                errors.append(f"{key}: {name} [{start}, {end}] crosses {open_[-1]}")
            open_.append((start, end, name))
    return errors


def test_the_trace_is_valid_with_one_row_per_rank(traced):
    schedule, _, path = traced
    data = json.loads(path.read_text())  # what Perfetto and chrome://tracing read
    rows = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "process_name"}
    assert rows == {r: f"rank {r}" for r in range(len(schedule))}
    assert all({"ph", "name", "pid", "ts"} <= e.keys() for e in data["traceEvents"]
               if e.get("ph") == "X")
    assert not _nesting_errors(data["traceEvents"])[:3]


def test_every_action_appears_once_in_order_and_lasts_its_cost(traced):
    schedule, _, path = traced
    tl = load(path)
    _, _, v, split = shape_of(schedule)
    for rank, actions in enumerate(schedule):
        got = tl.ranges(rank=rank, prefix=ACTIONS)
        assert [r.name for r in got] == [range_name(a) for a in actions], f"rank {rank}"
        for before, after in zip(got, got[1:], strict=False):
            assert before.end <= after.start + SLACK, f"rank {rank}: {before} overlaps {after}"
        for r, a in zip(got, actions, strict=True):
            cost = action_cost(a, v=v, split=split, t_f=COSTS[0], t_b=COSTS[1], t_w=COSTS[2])
            assert r.seconds >= cost - SLACK, f"{r} is shorter than its cost {cost}"


def test_the_actions_lie_within_the_run_and_agree_with_its_own_clock(traced):
    _, run, path = traced
    tl = load(path)
    start, end = tl.span(ACTIONS)
    marks = [e for e in tl.events if e.get("name") == CLOCK_SYNC]
    assert all(e["ts"] <= start * 1e6 for e in marks)  # after every rank's clock mark
    last = max(e["ts"] + e.get("dur", 0) for e in tl.events if e.get("ph") == "X") / 1e6
    assert end <= last  # before the profiler stopped
    assert end - start == pytest.approx(run.measured.makespan, abs=1e-3)


def test_the_idle_share_is_the_executor_s_bubble_plus_the_profiler_s_own_cost(traced):
    """Each profiler range encloses the executor's two perf_counter readings of its action,
    and is longer by what entering and leaving record_function costs (tens of microseconds,
    a few hundred under load): summed over 32 actions of a few ms each, up to 0.02 of the
    bubble. So the trace's idle share is the executor's bubble less that cost's share of
    the step."""
    schedule, run, path = traced
    tl = load(path)
    start, end = tl.span(ACTIONS)
    extra = []  # per action: profiler range - executor span, seconds
    for rank, spans in enumerate(run.measured.spans):
        got = {r.name: r for r in tl.ranges(rank=rank, prefix=ACTIONS)}
        extra += [got[range_name(s.action)].seconds - (s.end - s.start) for s in spans]
    assert min(extra) >= -SLACK, "a profiler range is shorter than the executor's own span"
    assert statistics.median(extra) < 5e-4, "record_function costs ~50 us, not this"
    share = idle_share(tl, ACTIONS)
    p = len(schedule)
    expected = 1 - (sum(run.measured.busy) + sum(extra)) / (p * (end - start))
    assert share == pytest.approx(expected, abs=1e-3)


def test_no_action_starts_before_the_action_it_waits_for_has_ended(traced):
    schedule, _, path = traced
    tl = load(path)
    p, _, v, _ = shape_of(schedule)
    when = {(r.rank, r.name): r for r in tl.ranges(prefix=ACTIONS)}
    checked = 0
    for rank, actions in enumerate(schedule):
        for a in actions:
            for q, dep in dependencies(a, rank, p, v):
                if q != rank:
                    consumer, producer = when[rank, range_name(a)], when[q, range_name(dep)]
                    assert consumer.start >= producer.end - SLACK, (consumer, producer)
                    checked += 1
    assert checked > 0


def test_each_message_is_a_send_range_around_the_tracer_s_isend(traced):
    schedule, run, path = traced
    tl = load(path)
    for rank in range(len(schedule)):
        sends = tl.ranges(rank=rank, prefix="send ")
        assert len(sends) == run.sends[rank]
        isends = tl.ranges(rank=rank, prefix="comm isend")
        assert all(any(s.start <= i.start and i.end <= s.end for i in isends) for s in sends)
        assert all(" to rank " in s.name for s in sends)
