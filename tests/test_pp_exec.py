"""parlab.pp.executor and parlab.pp.run: schedules run on real ranks over point-to-point messages.

References computed here, independently of the executor:
- the single-device, full-batch run: the same seeded model (parlab.pp.make_model is the
  model's definition, shared on purpose), mean-squared-error over the whole batch, one
  backward. In float64 the pipeline's loss and gradients differ from it only by the order of
  the additions (~1e-16 relative): rtol 1e-10.
- sends per rank: every stage but the last sends each microbatch's activation forward, every
  stage but the first its input gradient back. Rank r holds stages r, r + p, ..., so ranks
  0 and p - 1 send (2v - 1) m messages and the others 2vm.
- peak activations: GPipe m on every rank, 1F1B min(p - r, m) (chunks count 1/v).
- DualPipe-V (V placement: rank r holds stages r and 2p - 1 - r): rank 0 sends m activations
  from stage 0 and m gradients from stage 2p - 1, rank p - 1 m of each from stages p - 1 and
  p (the hand-over between them stays on the rank), the others 4m; every rank holds 2p + 1
  chunk-microbatches at its peak, p + 1/2 in units of its share. The executor runs an
  overlapped pair's actions one after the other, each as soon as its input is there: with
  t_f = t_b = t_w = t per share every rank idles (p - 1) t/2 (a chunk costs t/2) of a step of
  3mt + (p - 1) t/2, a bubble of (p - 1)/(6m + p - 1).
- timelines: every action's inputs ended before it started (causality); with sleep-based
  costs of 80 ms per rank-share, the measured bubble is within 0.03 of the closed forms
  (p-1)/(m+p-1), (p-1)/(vm+p-1) and, for ZB-H1 with t_f = t_b = t_w, (p-1)/(3m+p-1). The
  closed forms count no time for messages; each hand-over between ranks takes a few ms on a
  busy 2-core machine, and with 40 ms costs they added 0.02-0.034 to every measured bubble
  (a quiet machine in a slow spell), against 0.011-0.016 with 80 ms. Timing tests retry
  once: two CPU cores are shared with whatever else runs, and one unlucky run says little.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from parlab.pp import dependencies, make_data, make_model, make_schedule, run_pipeline

pytestmark = pytest.mark.usefixtures("no_orphans")
RTOL = 1e-10


def _single_device(n_layers: int, width: int = 16, batch: int = 16):
    model = make_model(n_layers, width, seed=0)
    x, y = make_data(batch, width, seed=0)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


CASES = [("gpipe", 2, 4, 1, 8), ("1f1b", 4, 8, 1, 8), ("1f1b", 3, 2, 1, 6),
         ("interleaved_1f1b", 4, 8, 2, 8), ("interleaved_1f1b", 2, 4, 3, 12),
         ("zb_h1", 4, 4, 1, 8), ("zb_h1", 2, 3, 1, 4), ("1f1b", 1, 4, 1, 8),
         ("interleaved_1f1b", 1, 2, 2, 8)]


@pytest.mark.parametrize("name, p, m, v, n_layers", CASES,
                         ids=[f"{c[0]}-p{c[1]}-m{c[2]}-v{c[3]}" for c in CASES])
def test_pipeline_equals_single_device(name, p, m, v, n_layers):
    batch = 12 if m == 3 else 16
    run = run_pipeline(make_schedule(name, p, m, v), n_layers=n_layers, batch=batch)
    ref_loss, ref_grads = _single_device(n_layers, batch=batch)
    assert run.loss == pytest.approx(ref_loss, rel=RTOL)
    assert set(run.grads) == set(ref_grads)  # every parameter of every layer, once
    for pname, ref in ref_grads.items():
        torch.testing.assert_close(run.grads[pname], ref, rtol=RTOL, atol=1e-14)
    sends = [m * (2 * v - 1)] + [2 * v * m] * (p - 2) + [m * (2 * v - 1)] if p > 1 else [0]
    assert run.sends == sends
    if name == "gpipe":
        assert run.measured.peak_activations == [m] * p
    if name == "1f1b":
        assert run.measured.peak_activations == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p, m", [(2, 4), (3, 7), (4, 8)])
def test_dualpipe_v_equals_single_device(p, m):
    n_layers, batch = 4 * p, 2 * m  # 2 layers per stage, 2 rows per microbatch
    run = run_pipeline(make_schedule("dualpipe_v", p, m), n_layers=n_layers, batch=batch)
    ref_loss, ref_grads = _single_device(n_layers, batch=batch)
    assert run.loss == pytest.approx(ref_loss, rel=RTOL)
    assert set(run.grads) == set(ref_grads)
    for pname, ref in ref_grads.items():
        torch.testing.assert_close(run.grads[pname], ref, rtol=RTOL, atol=1e-14)
    assert run.sends == [2 * m] + [4 * m] * (p - 2) + [2 * m]
    assert run.measured.peak_activations == [p + 0.5] * p


def test_dualpipe_v_order_without_its_placement_is_refused_before_any_rank_starts():
    plain = [list(order) for order in make_schedule("dualpipe_v", 2, 4)]
    with pytest.raises(ValueError, match="placement='v'"):
        run_pipeline(plain)
    run = run_pipeline(plain, placement="v", n_layers=8, batch=8)
    assert run.max_error() < 1e-10


def test_timeline_respects_every_dependency():
    sched = make_schedule("interleaved_1f1b", 2, 4, 2)
    run = run_pipeline(sched)
    ends = {(s.rank, s.action): s.end for row in run.measured.spans for s in row}
    for r, row in enumerate(run.measured.spans):
        assert [s.action for s in row] == sched[r]  # in list order, each once
        for before, after in itertools.pairwise(row):
            assert before.end <= after.start
        for s in row:
            for dep in dependencies(s.action, r, 2, 2):
                assert ends[dep] <= s.start, (r, s.action, dep)


def _bubble_within(schedule, costs, expected, tolerance=0.03):
    for _attempt in range(2):
        run = run_pipeline(schedule, costs=costs)
        measured = run.measured.bubble_fraction
        if abs(measured - expected) <= tolerance:
            break
    assert run.predicted.bubble_fraction == pytest.approx(expected, abs=1e-9)
    assert abs(measured - expected) <= tolerance, (measured, expected)
    assert run.max_error() < 1e-10
    return run


def test_measured_bubble_of_1f1b():
    p, m = 4, 8
    run = _bubble_within(make_schedule("1f1b", p, m), (0.08, 0.16, 0.0), (p - 1) / (m + p - 1))
    assert run.measured.makespan >= (m + p - 1) * 0.24  # sleeping never ends early


def test_measured_bubble_of_interleaved():
    # Costs per rank's share; each action here is one of v = 2 chunks, so it lasts half: 0.16 s
    # and 0.32 s give its actions the 80 ms and 160 ms of test_measured_bubble_of_1f1b's.
    p, m, v = 4, 8, 2
    _bubble_within(make_schedule("interleaved_1f1b", p, m, v), (0.16, 0.32, 0.0),
                   (p - 1) / (v * m + p - 1))


def test_measured_bubble_of_zb_h1():
    p, m = 4, 8
    _bubble_within(make_schedule("zb_h1", p, m), (0.08, 0.08, 0.08), (p - 1) / (3 * m + p - 1))


def test_measured_bubble_of_dualpipe_v():
    # Costs per rank's share, as for ZB-H1; each action here is one of two chunks, so it lasts
    # half: 0.16 s gives its 48 actions a rank the 80 ms of the other tests' actions.
    p, m = 4, 8
    _bubble_within(make_schedule("dualpipe_v", p, m), (0.16, 0.16, 0.16), (p - 1) / (6 * m + p - 1))
