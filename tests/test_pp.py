"""parlab.pp (schedules, validate), parlab.pp.simulator (simulate) and parlab.pp.plot.

Expected values are derived here, independently of the code under test:
- GPipe and 1F1B with zero latency take T = (m + p - 1)(t_f + t_b): the last stage gets
  microbatch 0 after (p - 1) t_f, works m (t_f + t_b) without a break, and the last gradient
  needs (p - 1) t_b to reach stage 0. Each rank is busy m (t_f + t_b), so the bubble share is
  (p - 1)/(m + p - 1) and the idle/useful ratio (p - 1)/m. With a latency l per message, GPipe
  adds l on each of the 2 (p - 1) boundaries of the critical path.
- Interleaved 1F1B with v chunks: the fill and drain cross p - 1 rank boundaries of a chunk
  each, (t_f + t_b)/v, so T = m (t_f + t_b) + (p - 1)(t_f + t_b)/v and the share is
  (p - 1)/(vm + p - 1) (Megatron's analysis).
- ZB-H1 with t_f = t_b = t_w = t: each rank idles (p - 1) t against 1F1B's 3 (p - 1) t (its B
  costs t_b + t_w), for m >= p.
- GPipe holds m microbatches on every rank; 1F1B at most min(p - r, m) on rank r.
- Hand-built schedules (a 2-rank unbalanced 1F1B timed by hand below, deadlocks, bad orders).
"""

from __future__ import annotations

import itertools

import matplotlib
import pytest
from matplotlib.figure import Figure

from parlab.errors import reference_message, refused
from parlab.pp import Action, ScheduleError, make_schedule, simulate, validate
from parlab.pp import plot as pp_plot
from parlab.pp import schedules as pp
from parlab.pp import simulator as pp_sim

matplotlib.use("Agg")
F, B, W = (lambda i, c=0, k=k: Action(k, i, c) for k in "FBW")
GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 8, 16)]


# --- the schedules, by hand -----------------------------------------------------------------

def test_gpipe_and_1f1b_by_hand():
    assert make_schedule("gpipe", 2, 2) == [[F(0), F(1), B(0), B(1)]] * 2
    assert make_schedule("1f1b", 3, 4) == [
        [F(0), F(1), F(2), B(0), F(3), B(1), B(2), B(3)],
        [F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)],
        [F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)],
    ]
    assert make_schedule("1f1b", 3, 1) == [[F(0), B(0)]] * 3  # m < p - r - 1: warm-up is m


def test_interleaved_by_hand():
    # p = 2, m = 2, v = 2: forwards go in groups of p microbatches, chunk 0 then chunk 1;
    # rank r's warm-up is 2 (p - r - 1) + (v - 1) p chunk-forwards
    assert make_schedule("interleaved_1f1b", 2, 2, 2) == [
        [F(0), F(1), F(0, 1), F(1, 1), B(0, 1), B(1, 1), B(0), B(1)],
        [F(0), F(1), F(0, 1), B(0, 1), F(1, 1), B(1, 1), B(0), B(1)],
    ]
    assert make_schedule("interleaved_1f1b", 3, 6, 1) == make_schedule("1f1b", 3, 6)
    # Megatron's warm-up, 2 (p - r - 1) + (v - 1) p chunk-forwards (capped at m v): rank r runs
    # one more (the first steady step's) before its first backward
    for p, m, v in [(4, 8, 2), (4, 4, 3), (2, 2, 2), (8, 8, 2)]:
        for r, order in enumerate(make_schedule("interleaved_1f1b", p, m, v)):
            first_b = next(i for i, a in enumerate(order) if a.kind == "B")
            assert first_b == min(2 * (p - r - 1) + (v - 1) * p + 1, m * v)


def test_zb_h1_has_every_w_once_and_after_its_b():
    for p, m in [(2, 3), (4, 8), (4, 2)]:
        for order in make_schedule("zb_h1", p, m):
            assert sorted(a.microbatch for a in order if a.kind == "W") == list(range(m))
            for i in range(m):
                assert order.index(F(i)) < order.index(B(i)) < order.index(W(i))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1"])
def test_every_schedule_is_valid(name):
    for p, m in GRID:
        validate(make_schedule(name, p, m))
    for p, v in [(2, 2), (2, 3), (3, 2), (4, 2), (4, 4)]:
        for m in (p, 2 * p, 3 * p):
            validate(make_schedule("interleaved_1f1b", p, m, v))


def test_make_schedule_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="multiple of p"):
        make_schedule("interleaved_1f1b", 4, 6, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("pipedream", 2, 2)
    with pytest.raises(ValueError, match="interleaved"):
        make_schedule("gpipe", 2, 2, v=2)
    with pytest.raises(ValueError, match="m must be"):
        make_schedule("1f1b", 2, 0)
    with pytest.raises(ValueError, match="kind"):
        Action("X", 0)
    assert str(Action("B", 3, 1)) == "B3.1" and str(F(2)) == "F2"


# --- validate ---------------------------------------------------------------------------------

def test_validate_names_a_backward_before_its_forward():
    with pytest.raises(ScheduleError, match=r"rank 1 runs B0 \(position 0\) before F0"):
        validate([[F(0), B(0)], [B(0), F(0)]])
    with pytest.raises(ScheduleError, match=r"rank 0 runs W0 .* before B0"):
        validate([[F(0), W(0), B(0)], [F(0), B(0), W(0)]])


def test_validate_names_missing_and_repeated_actions():
    with pytest.raises(ScheduleError, match="rank 1 never runs B1"):
        validate([[F(0), F(1), B(0), B(1)], [F(0), F(1), B(0)]])
    with pytest.raises(ScheduleError, match="rank 0 runs F0 twice"):
        validate([[F(0), F(0), B(0)], [F(0), B(0)]])
    with pytest.raises(ScheduleError, match="never runs W1"):  # W for some, not all
        validate([[F(0), F(1), B(0), W(0), B(1)], [F(0), F(1), B(0), B(1)]])


def test_validate_names_a_deadlock_and_its_cycle():
    # rank 0 waits for rank 1's B0, which needs rank 1's F1 first, which needs rank 0's F1
    deadlock = [[F(0), B(0), F(1), B(1)], [F(0), F(1), B(0), B(1)]]
    with pytest.raises(ScheduleError) as info:
        validate(deadlock)
    text = str(info.value)
    assert "rank 0 waits at B0 for rank 1's B0" in text
    assert "rank 1 waits at F1 for rank 0's F1" in text
    assert "ranks 0 -> 1 -> 0" in text
    # three ranks: the waits need not all be in the cycle, but they are named
    with pytest.raises(ScheduleError, match="deadlock"):
        validate([[F(0), B(0), F(1), B(1)], [F(0), F(1), B(0), B(1)], [F(0), B(0), F(1), B(1)]])


# --- simulate: bubble, makespan, memory -----------------------------------------------------------

@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("t_f, t_b", [(1, 2), (1, 1), (2, 3)])
def test_bubble_of_gpipe_and_1f1b(name, t_f, t_b):
    for p, m in GRID:
        r = simulate(make_schedule(name, p, m), t_f, t_b)
        assert r.makespan == pytest.approx((m + p - 1) * (t_f + t_b))
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        assert r.bubble_ratio == pytest.approx((p - 1) / m, abs=1e-12)
        assert r.busy == pytest.approx([m * (t_f + t_b)] * p)


@pytest.mark.parametrize("t_f, t_b", [(1, 2), (1, 1), (3, 1)])
def test_bubble_of_interleaved(t_f, t_b):
    for p, v in [(2, 2), (2, 3), (4, 2), (4, 4), (8, 2)]:
        for m in (p, 2 * p, 4 * p):
            r = simulate(make_schedule("interleaved_1f1b", p, m, v), t_f, t_b)
            assert r.makespan == pytest.approx(m * (t_f + t_b) + (p - 1) * (t_f + t_b) / v)
            assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
            assert r.busy == pytest.approx([m * (t_f + t_b)] * p)  # a chunk costs 1/v


def test_zb_h1_leaves_a_third_of_1f1b_idle_time():
    for p in (2, 3, 4, 8):
        for m in (p, p + 3, 2 * p, 4 * p):
            zb = simulate(make_schedule("zb_h1", p, m), 1, 1, 1)
            base = simulate(make_schedule("1f1b", p, m), 1, 1, 1)  # B costs t_b + t_w = 2
            assert zb.idle == pytest.approx([p - 1] * p)
            assert base.idle == pytest.approx([3 * (p - 1)] * p)
            assert max(zb.peak_activations) <= p  # no more than 1F1B's peak


def test_peak_activations():
    for p, m in GRID:
        assert simulate(make_schedule("gpipe", p, m)).peak_activations == [m] * p
        assert simulate(make_schedule("1f1b", p, m)).peak_activations == [
            min(p - r, m) for r in range(p)]
    # interleaved, p = 2, m = 2, v = 2, from the hand-built lists above: rank 0 holds all 4
    # chunk-microbatches before its first backward, rank 1 three; a chunk counts 1/2
    r = simulate(make_schedule("interleaved_1f1b", 2, 2, 2))
    assert r.peak_activations == [2.0, 1.5]
    # in general the warm-up plus one chunk-forward are held at once, a chunk counting 1/v
    p, m, v = 4, 8, 2
    r = simulate(make_schedule("interleaved_1f1b", p, m, v))
    assert r.peak_activations == [(2 * (p - q - 1) + (v - 1) * p + 1) / v for q in range(p)]


def test_w_folds_into_b_without_w_actions():
    sched = make_schedule("1f1b", 4, 8)
    assert simulate(sched, 1, 2, 1).makespan == simulate(sched, 1, 3, 0).makespan


def test_latency_on_gpipe():
    for p, m in [(2, 3), (4, 8), (3, 1)]:
        lat = 0.25
        r = simulate(make_schedule("gpipe", p, m), 1, 2, latency=lat)
        assert r.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * lat)


def test_unbalanced_stages_by_hand():
    # 1F1B, p = 2, m = 3, stage 1 twice as slow (F 2, B 4; stage 0: F 1, B 2). By hand:
    # r0 F0 [0,1] F1 [1,2]; r1 F0 [1,3] B0 [3,7]; r0 B0 [7,9]; r1 F1 [7,9] B1 [9,13];
    # r0 F2 [9,10] B1 [13,15]; r1 F2 [13,15] B2 [15,19]; r0 B2 [19,21]
    r = simulate(make_schedule("1f1b", 2, 3), 1, 2, stage_costs=[1, 2])
    assert r.makespan == 21 and r.busy == [9, 18]
    assert r.bubble_fraction == pytest.approx(1 - 27 / 42)
    starts = {(s.rank, str(s.action)): s.start for row in r.spans for s in row}
    assert starts[(1, "F1")] == 7 and starts[(0, "B1")] == 13 and starts[(0, "B2")] == 19


def test_simulate_rejects_bad_costs_and_schedules():
    with pytest.raises(ValueError, match="t_f"):
        simulate(make_schedule("1f1b", 2, 2), t_f=-1)
    with pytest.raises(ValueError, match="stage_costs"):
        simulate(make_schedule("1f1b", 2, 2), stage_costs=[1])
    with pytest.raises(ScheduleError):
        simulate([[F(0), B(0)], [B(0), F(0)]])


# --- balancing ---------------------------------------------------------------------------------

def _brute_force(costs: list[float], p: int) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), p - 1):
        bounds = (0, *cuts, len(costs))
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def test_balance_stages_is_optimal():
    cases = [([0.2] + [1.0] * 10 + [2.6], 4), ([3, 1, 1, 1, 1, 3], 3), ([1.0] * 6, 6),
             ([5, 1, 1, 1], 2), ([0.3, 2.2, 0.7, 1.9, 1.1, 0.4, 2.5], 3)]
    for costs, p in cases:
        counts = pp_sim.balance_stages(costs, p)
        assert len(counts) == p and min(counts) >= 1 and sum(counts) == len(costs)
        assert max(pp_sim.stage_times(costs, counts)) == pytest.approx(_brute_force(costs, p))


def test_reference_functions_can_be_refused():
    with refused([pp.one_f_one_b, pp_sim.balance_stages], reference_message("the reference")):
        with pytest.raises(AssertionError, match="course's own reference"):
            make_schedule("1f1b", 2, 2)
        with pytest.raises(AssertionError, match="course's own reference"):
            pp_sim.balance_stages([1, 1], 2)
        make_schedule("gpipe", 2, 2)  # not refused
    make_schedule("1f1b", 2, 2)  # restored


# --- pictures -----------------------------------------------------------------------------------

def test_space_time_diagram_is_labelled():
    from parlab.pp import SimResult, plot_schedule  # DESIGN.md: parlab.pp's public API
    from parlab.pp import simulate as simulate_from_pp

    assert simulate_from_pp is simulate and SimResult is pp_sim.SimResult

    fig = plot_schedule(make_schedule("interleaved_1f1b", 4, 8, 2))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert "time" in ax.get_xlabel() and "bubble 15.8%" in ax.get_title()  # 3/19
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("forward" in s for s in legend) and any("bubble" in s for s in legend)
    assert any("chunk" in s for s in legend)
    zb = pp_plot.plot_schedule(make_schedule("zb_h1", 2, 2), 1, 1, 1)
    assert any("weight" in t.get_text() for t in zb.axes[0].get_legend().get_texts())


def test_side_by_side_shares_the_time_axis():
    a = simulate(make_schedule("1f1b", 2, 4), 0.01, 0.02)
    b = simulate(make_schedule("1f1b", 2, 4), 0.01, 0.03)
    fig = pp_plot.plot_side_by_side(a, b)
    left, right = fig.axes[:2]
    assert "predicted" in left.get_title() and "measured" in right.get_title()
    assert left.get_xlim() == right.get_xlim() and left.get_xlim()[1] == pytest.approx(
        b.makespan * 1e3)


def test_min_microbatches_at_values_where_rounding_decides():
    # module 04's practice numbers come from costs.min_microbatches. Reference: the smallest m
    # found by trying every m, in exact fractions of the decimal as written. The cases include
    # exact boundaries where the float formula rounds past the whole number and a float ceil
    # says one more (p = 4, 20%: 3 * 0.8 / 0.2 = 12.000000000000002 in floats, m = 12 is exact;
    # p = 7, 20%; p = 8, 70%) and values in between
    from fractions import Fraction

    from parlab import costs

    def smallest(p, x, v, form):
        x = Fraction(repr(x))
        bubble = (lambda m: Fraction(p - 1, v * m + p - 1)) if form == "fraction" else (
            lambda m: Fraction(p - 1, v * m))
        return next(m for m in itertools.count(1) if bubble(m) <= x)

    assert 3 * (1 - 0.2) / 0.2 > 12  # the float form really rounds up past the boundary
    for p, x, v in [(4, 0.2, 1), (4, 0.2, 2), (7, 0.2, 1), (8, 0.7, 1), (4, 0.6, 1),
                    (8, 0.15, 1), (8, 0.15, 2), (5, 0.3, 1), (3, 0.05, 2), (16, 0.125, 4),
                    (7, 0.35, 3)]:
        for form in ("fraction", "ratio"):
            assert costs.min_microbatches(p, x, v, form=form) == smallest(p, x, v, form), (
                p, x, v, form)
