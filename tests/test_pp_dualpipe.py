"""DualPipe-V in parlab.pp: the schedule, its placement, its simulation and its closed forms.

Everything expected is rebuilt here from the DualPipe-V definition, not from parlab.pp:
- the order: `_definition` transcribes `DualPipeV.step` of github.com/deepseek-ai/DualPipe
  (dualpipe/dualpipev.py) step by step, with its own zero-bubble switch in step 6 (the
  `i == step_6 // 2` test on the rank's parity) and its FIFO queue of weight gradients; a
  backward that is not zero-bubble is written B then W at once, the overlapped
  `_forward_backward_chunk` calls are recorded as pairs;
- the placement: rank r holds stage r (phase 0) and stage 2p - 1 - r (phase 1);
- the timing: `_simulate` is an event simulation written here: each rank runs its units in
  order (a pair is one unit that starts when the inputs of both its actions exist), an F of
  stage s needs the F of stage s - 1, a B of stage s its own F and the B of stage s + 1, a W
  its B; no latency;
- the closed forms (DualPipe's README table, per chunk: F, B the full backward, W, F&B):
  the bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages is the last rank's idle time when
  a chunk's F, input-gradient backward and W cost the same; its step is its 2m - 2p - 1
  pairs, 2p + 1 unpaired F and B, and that bubble; peak activations 2p + 1 chunks (PP + 1).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from parlab import pp

CASES = [(p, m) for p in (1, 2, 3, 4, 5) for m in (2 * p, 2 * p + 1, 3 * p + 2)]


def _definition(p: int, m: int) -> tuple[list[list[tuple]], list[list[tuple[int, int]]]]:
    orders, pairs = [], []
    for rank in range(p):
        acts: list[tuple] = []
        paired: list[tuple[int, int]] = []
        f_id, b_id, queue = [0, 0], [0, 0], []

        def forward(phase, acts=acts, f_id=f_id):
            acts.append(("F", f_id[phase], phase))
            f_id[phase] += 1

        def backward(phase, zb=False, acts=acts, b_id=b_id, queue=queue):
            acts.append(("B", b_id[phase], phase))
            (queue.append if zb else acts.append)(("W", b_id[phase], phase))
            b_id[phase] += 1

        def weight(acts=acts, queue=queue):
            acts.append(queue.pop(0))

        def forward_backward(p0, p1, acts=acts, paired=paired):
            start = len(acts)
            forward(p0)
            backward(p1)
            paired.append((start, len(acts)))

        for _ in range((p - rank - 1) * 2):  # step 1: nF0
            forward(0)
        for _ in range(rank + 1):  # step 2: nF0F1
            forward(0)
            forward(1)
        for _ in range(p - rank - 1):  # step 3: nB1W1F1 (zero bubble)
            backward(1, zb=True)
            weight()
            forward(1)
        for i in range(m - p * 2 + rank + 1):  # step 4: nF0B1F1B0
            if i == 0 and rank == p - 1:
                forward(0)
                backward(1)
            else:
                forward_backward(0, 1)
            forward_backward(1, 0)
        for _ in range(p - rank - 1):  # step 5: nB1F1B0
            backward(1)
            forward_backward(1, 0)
        step_6, zb = rank + 1, False  # step 6: nB1B0, the second half zero bubble
        for i in range(step_6):
            if i == step_6 // 2 and rank % 2 == 1:
                zb = True
            backward(1, zb)
            if i == step_6 // 2 and rank % 2 == 0:
                zb = True
            backward(0, zb)
        for _ in range(p - rank - 1):  # step 7: nWB0 (zero bubble)
            weight()
            backward(0, zb=True)
        for _ in range(rank + 1):  # step 8: nW
            weight()
        assert not queue
        orders.append(acts)
        pairs.append(paired)
    return orders, pairs


def _stage(rank: int, chunk: int, p: int) -> int:
    return rank if chunk == 0 else 2 * p - 1 - rank


def _simulate(orders, pairs, p, f, b, w, fb=None):
    """(makespan, busy per rank): see the module docstring. Costs per chunk; b is the input
    backward; fb the cost of a pair (None: no pairs, every action on its own)."""
    where = {(_stage(r, c, p)): (r, c) for r in range(p) for c in (0, 1)}
    cost = {"F": f, "B": b, "W": w}
    units = []
    for r, acts in enumerate(orders):
        starts = dict(pairs[r]) if fb is not None else {}
        rank_units, i = [], 0
        while i < len(acts):
            stop = starts.get(i, i + 1)
            rank_units.append((acts[i:stop], fb if stop - i > 1 else cost[acts[i][0]]))
            i = stop
        units.append(rank_units)

    def needs(r, a):
        kind, i, c = a
        s = _stage(r, c, p)
        if kind == "W":
            return [(r, ("B", i, c))]
        if kind == "F":
            return [] if s == 0 else [(where[s - 1][0], ("F", i, where[s - 1][1]))]
        out = [(r, ("F", i, c))]
        return out + ([(where[s + 1][0], ("B", i, where[s + 1][1]))] if s < 2 * p - 1 else [])

    done, free, pos, busy = {}, [0] * p, [0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(units[r]):
                acts, c = units[r][pos[r]]
                deps = [d for a in acts for d in needs(r, a) if d[1] not in acts or d[0] != r]
                if any(d not in done for d in deps):
                    break
                end = max([free[r]] + [done[d] for d in deps]) + c
                done.update({(r, a): end for a in acts})
                free[r], busy[r], pos[r], moved = end, busy[r] + c, pos[r] + 1, True
    assert pos == [len(u) for u in units], "the definition deadlocked"
    return max(free), busy


@pytest.mark.parametrize("p, m", CASES)
def test_order_and_pairs_are_dualpipe_v(p, m):
    sched = pp.make_schedule("dualpipe_v", p, m)
    orders, pairs = _definition(p, m)
    assert [[(a.kind, a.microbatch, a.chunk) for a in o] for o in sched] == orders
    assert pp.overlapped_units(sched) == pairs
    assert pp.placement_of(sched) == "v"
    for r in range(p):
        assert pp.dualpipe_v_rank(r, p, m) == sched[r]
    pp.validate(sched)


def test_v_placement_is_readable_from_outside():
    for p in (1, 2, 3, 5):
        for r in range(p):
            for c in (0, 1):
                s = pp.stage_of(r, c, p, placement="v")
                assert s == _stage(r, c, p)
                assert pp.rank_and_chunk(s, p, placement="v") == (r, c)
        assert pp.stage_of(1, 1, p + 1) == p + 2  # looped stays the default: c p + r
    with pytest.raises(ValueError, match="two chunks"):
        pp.stage_of(0, 2, 4, placement="v")
    with pytest.raises(ValueError, match="placement"):
        pp.stage_of(0, 0, 4, placement="zigzag")


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("f, b, w, fb", [(1, 1, 1, None), (1, 1, 1, 3), (1, 1, 1, 2),
                                         (2, 3, 1, 4), (1, 2, 1, 3), (3, 1, 2, 5)])
def test_simulation_agrees_with_an_independent_one(p, m, f, b, w, fb):
    orders, pairs = _definition(p, m)
    frac = [Fraction(x) for x in (f, b, w)]
    makespan, busy = _simulate(orders, pairs, p, *frac, None if fb is None else Fraction(fb))
    # parlab's costs are for a rank's whole share: a chunk costs half
    got = pp.simulate(pp.make_schedule("dualpipe_v", p, m), 2 * f, 2 * b, 2 * w,
                      t_fb=None if fb is None else 2 * fb)
    assert got.makespan == pytest.approx(float(makespan), abs=1e-9)
    assert got.busy == pytest.approx([float(x) for x in busy], abs=1e-9)
    assert got.bubble_fraction == pytest.approx(1 - float(sum(busy)) / (p * float(makespan)))


@pytest.mark.parametrize("p, m", CASES)
@pytest.mark.parametrize("t, fb", [(1, 3), (1, 2), (1, 2.5), (2, 5), (2, 4.5)])
def test_the_published_bubble_where_its_conventions_hold(p, m, t, fb):
    # a chunk's F = input backward = W = t, the full backward 2t, a pair from max(F, B) = 2t
    # (the forward fully hidden) to F + B = 3t (no gain; both halves still wait for both
    # inputs)
    sched = pp.make_schedule("dualpipe_v", p, m)
    res = pp.simulate(sched, 2 * t, 2 * t, 2 * t, t_fb=2 * fb)
    pair = fb
    bubble = (p - 1) * (pair + 2 * t - 3 * t)  # (PP/2 - 1)(F&B + B - 3W), PP = 2p
    assert pp.dualpipe_v_bubble(p, t, 2 * t, t, pair) == pytest.approx(bubble)
    assert res.idle[-1] == pytest.approx(bubble)
    assert max(res.idle) == pytest.approx(bubble)  # the last rank idles most
    step = (2 * m - 2 * p - 1) * pair + (2 * p + 1) * 3 * t + bubble
    assert res.makespan == pytest.approx(step)
    assert pp.dualpipe_v_makespan(p, m, t, 2 * t, t, pair) == pytest.approx(step)
    assert res.peak_activations == [(2 * p + 1) / 2] * p  # 2p + 1 chunks: PP + 1
    assert pp.dualpipe_v_peak(p) == (2 * p + 1) / 2


def test_without_pairs_the_cpu_order_idles_less():
    # t_fb=None: each action starts on its own inputs (what the CPU executor does), so the
    # forward of a would-be pair need not wait for its backward's gradient. With F = B_in = W
    # = 1 the last rank idles p - 1, half the published 2(p - 1) for a pair costing F + B
    for p, m in [(2, 4), (3, 7), (4, 8)]:
        res = pp.simulate(pp.make_schedule("dualpipe_v", p, m), 2, 2, 2)
        assert res.idle == pytest.approx([p - 1] * p)
        assert pp.dualpipe_v_bubble(p, 1, 2, 1) == pytest.approx(2 * (p - 1))


def test_where_the_published_bubble_is_not_exact():
    # an input backward twice the forward (F = W = 1, B_in = 2): the last rank idles less
    # than the published form says, by 1 for p = 2 (independent simulation above agrees)
    p, m = 2, 6
    res = pp.simulate(pp.make_schedule("dualpipe_v", p, m), 2, 4, 2, t_fb=6)
    assert res.idle[-1] == pytest.approx(2.0)
    assert pp.dualpipe_v_bubble(p, 1, 3, 1, 3) == pytest.approx(3.0)


def test_a_third_of_1f1b_bubble_on_the_same_ranks():
    # same p ranks and model, a rank's share costing t_f = t_b = t_w = 2: 1F1B idles
    # (p - 1)(t_f + t_b + t_w) = 6(p - 1); ZB-H1 (p - 1)(t_f + t_b - t_w) = 2(p - 1); DualPipe-V
    # with pairs that gain nothing (t_fb = 6) the published (p - 1)(F&B + B - 3W) with chunk
    # costs F = W = 1, B = 2, F&B = 3: 2(p - 1), ZB-H1's, a third of 1F1B's
    for p in (2, 3, 4):
        m = 2 * p + 2
        base = pp.simulate(pp.make_schedule("1f1b", p, m), 2, 2, 2)
        zb = pp.simulate(pp.make_schedule("zb_h1", p, m), 2, 2, 2)
        v = pp.simulate(pp.make_schedule("dualpipe_v", p, m), 2, 2, 2, t_fb=6)
        assert base.idle[0] == pytest.approx(6 * (p - 1))
        assert zb.idle[0] == pytest.approx(2 * (p - 1))
        assert v.idle[-1] == pytest.approx(2 * (p - 1))


def test_make_schedule_refuses_what_dualpipe_v_cannot_run():
    with pytest.raises(ValueError, match="m >= 2p"):
        pp.make_schedule("dualpipe_v", 3, 5)
    with pytest.raises(ValueError, match="two chunks"):
        pp.make_schedule("dualpipe_v", 2, 4, v=3)
    assert pp.make_schedule("dualpipe_v", 2, 4, v=2) == pp.make_schedule("dualpipe_v", 2, 4)


def test_a_plain_copy_reads_as_looped_and_is_told_why():
    sched = pp.make_schedule("dualpipe_v", 3, 6)
    plain = [list(order) for order in sched]
    assert plain == sched and pp.placement_of(plain) == "looped"
    with pytest.raises(pp.ScheduleError, match="placement='v'"):
        pp.validate(plain)
    pp.validate(plain, placement="v")
    assert pp.simulate(plain, placement="v").makespan == pp.simulate(sched).makespan
    with pytest.raises(pp.ScheduleError, match="chunk 1"):  # only chunk 0: half the V missing
        pp.validate([[a for a in order if a.chunk == 0] for order in sched], placement="v")


def test_the_diagram_marks_overlapped_pairs():
    import matplotlib

    matplotlib.use("Agg")
    fig = pp.plot_schedule(pp.make_schedule("dualpipe_v", 3, 6), 2, 2, 2, t_fb=5)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("F&B" in s for s in legend) and any("bubble" in s for s in legend)
    plain = pp.plot_schedule(pp.make_schedule("dualpipe_v", 3, 6), 2, 2, 2)
    assert not any("F&B" in t.get_text() for t in plain.axes[0].get_legend().get_texts())
