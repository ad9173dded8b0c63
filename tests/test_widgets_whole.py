"""Module 08's widgets: the 3D rank grid with its links, and memory per GPU as recomputation
and ZeRO change.

References computed here, independently of the widgets: the groups of the grid
arange(world).view(dp, pp, cp, tp) taken by hand, which node each rank sits on (r // g), and
the first stage's bytes by part written out from the planner's documented formulas (module 07:
P_0 = ceil(L/p) P_layer + Vh, 2 + 2 + 12 bytes per parameter over t, ZeRO-1 dividing the 12
by dp·cp; 34 s b h / t per layer kept under 1F1B for min(p, m) micro-batches).
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from parlab import plan  # noqa: E402
from parlab.widgets import (  # noqa: E402
    describe_grid,
    describe_memory_3d,
    grid_explorer,
    grid_summary,
    h100_cluster,
    memory_explorer_3d,
    memory_summary_3d,
)

NOTEBOOK_WIDTH_IN = 9.8  # JupyterLab's output area at 100 dpi (about 980 px): wider is shrunk
MODEL = plan.Model("70B test model", 70e9, layers=80, hidden=8192, heads=64, seq=8192,
                   vocab=128256)


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_grid_groups_and_links_match_the_grid_by_hand():
    s = grid_summary(dp=2, pp=2, tp=2, gpus_per_node=4)
    grid = torch.arange(8).view(2, 2, 2)  # (dp, pp, tp)
    assert sorted(s["groups"]["tp"]) == sorted(grid.reshape(-1, 2).tolist())
    assert sorted(s["groups"]["pp"]) == sorted(grid.permute(0, 2, 1).reshape(-1, 2).tolist())
    assert sorted(s["groups"]["dp"]) == sorted(grid.permute(1, 2, 0).reshape(-1, 2).tolist())
    # 4 per node: TP {0,1} and PP {0,2} stay in node 0, DP {0,4} crosses to node 1
    assert s["links"] == {"tp": ("NVLink", 1), "pp": ("NVLink", 1), "dp": ("network", 2)}
    assert s["ranks"][5]["coords"] == {"dp": 1, "pp": 0, "ep": 0, "cp": 0, "tp": 1}
    assert "DP 2 on network (spans 2 nodes)" in describe_grid(s)


def test_grid_figure_labels_every_rank_and_names_each_link():
    w = grid_explorer(dp=2, pp=2, tp=2, gpus_per_node=4)
    texts = [t.get_text() for t in w.figure.axes[0].texts]
    assert all(str(r) in texts for r in range(8)) and "(1,0,1)" in texts
    assert "TP 2 · NVLink (inside a node)" in _legend(w.figure)
    assert any(t.startswith("DP 2 · network (spans 2 nodes)") for t in _legend(w.figure))
    w.controls["gpus_per_node"].value = 2  # now PP {0, 2} crosses nodes too
    assert w.summary["links"]["pp"] == ("network", 2)
    w.controls["tp"].value = 3  # 12 ranks, TP groups of 3 on nodes of 2: cut by a boundary
    assert w.summary["world"] == 12 and w.summary["links"]["tp"] == ("network", 2)
    assert "TP 3 · network (spans 2 nodes)" in _legend(w.figure)


def test_memory_by_part_follows_the_planners_formulas():
    cluster = h100_cluster(256)
    s = memory_summary_3d(tp=8, pp=4, cp=2, micro_batch=1, strategy="zero1",
                          recompute="selective", model=MODEL, cluster=cluster, global_batch=512)
    dp, m, t, cp = 4, 128, 8, 2
    assert (s["dp"], s["m"]) == (dp, m)
    embed = 128256 * 8192
    p0 = (math.ceil(80 / 4) * (70e9 - 2 * embed) / 80 + embed) / t
    bars = s["bars"][("selective", "zero1")]
    assert bars["weights"] == pytest.approx(2 * p0) and bars["gradients"] == pytest.approx(2 * p0)
    assert bars["optimizer state"] == pytest.approx(12 * p0 / (dp * cp))
    assert s["bars"][("selective", "ddp")]["optimizer state"] == pytest.approx(12 * p0)
    s_c = 8192 // cp
    assert bars["activations"] == pytest.approx(min(4, m) * 20 * 34 * s_c * 8192 / t)
    full = s["bars"][("full", "zero1")]["activations"]
    assert full == pytest.approx(min(4, m) * 20 * 2 * s_c * 8192 / t + 34 * s_c * 8192 / t)
    none = s["bars"][("none", "zero1")]["activations"]
    assert none - bars["activations"] == pytest.approx(80 * 5 * 64 * s_c * 8192 / t)
    assert "fits" in describe_memory_3d(s)


def test_memory_explorer_moves_with_recompute_and_zero():
    w = memory_explorer_3d(model=MODEL, cluster=h100_cluster(256), global_batch=512)
    before = w.summary["totals"][w.summary["chosen"]]
    w.controls["recompute"].value = "full"
    assert w.summary["totals"][w.summary["chosen"]] < before
    w.controls["strategy"].value = "ddp"
    assert w.summary["chosen"] == ("full", "ddp")
    assert "ddp with full recomputation" in w.html.value
    ax = w.figure.axes[0]
    assert ax.get_ylabel() and ax.get_title() and ax.get_legend() is not None
    w.controls["tp"].value = 16
    w.controls["pp"].value = 32
    assert "error" in w.summary  # 512 GPUs' worth of tp·pp: nothing left for DP


def _event(pid: int, name: str, start_ms: float, dur_ms: float) -> dict:
    return {"ph": "X", "pid": pid, "tid": 0, "name": name, "ts": start_ms * 1e3,
            "dur": dur_ms * 1e3}


def test_step_trace_classifies_the_last_step_by_name():
    from parlab.timeline import Timeline
    from parlab.widgets import classify, last_step, plot_step_trace

    events = [_event(0, "F mb0 chunk0", 0, 5), _event(0, "B mb0 chunk0", 6, 8),  # step 0
              _event(0, "F mb0 chunk0", 20, 5), _event(0, "send F mb0 to stage 1", 25, 0.1),
              _event(0, "comm all_gather (2x8x32) float32", 21, 1),
              _event(0, "B mb0 chunk0", 30, 10), _event(0, "allreduce bucket 0 (36 KiB)", 35, 0.2),
              _event(0, "wait bucket 0", 41, 2), _event(0, "aten::mm", 22, 1)]
    events += [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}}]
    tl = Timeline({"traceEvents": events})
    assert last_step(tl) == pytest.approx((0.020, 0.043))
    kinds = classify(tl, rank=0, window=last_step(tl))
    assert [len(kinds[k]) for k in ("F", "B", "tp", "pp", "dp", "wait")] == [1, 1, 1, 1, 1, 1]
    fig = plot_step_trace(tl, coords={0: (0, 0, 0)})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["F0", "B0"]  # the last step only, labelled by micro-batch
    assert fig.axes[0].get_xlabel().startswith("milliseconds")


@pytest.mark.parametrize("sizes", [dict(dp=2, pp=2, tp=4, gpus_per_node=4),  # 16 ranks
                                   dict(dp=4, pp=4, tp=4, gpus_per_node=8),  # 64
                                   dict(dp=2, pp=2, tp=2, gpus_per_node=2, cp=2)])
def test_grid_figure_stays_readable_at_the_sizes_the_sliders_allow(sizes):
    """Wider than a notebook's output, a figure is shrunk with its type: the grid wraps its
    nodes into rows instead, and every label stays at least 7 pt (about 10 px) as shown."""
    from parlab.widgets.whole import plot_grid

    s = grid_summary(**sizes)
    fig = plot_grid(s)
    width, _ = fig.get_size_inches()
    shrink = min(1.0, NOTEBOOK_WIDTH_IN / width)  # what JupyterLab does to a wider image
    shown = [t.get_fontsize() * shrink for t in fig.axes[0].texts]
    assert min(shown) >= 7, f"{width:.1f} in wide: labels shown at {min(shown):.1f} pt"
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert all(str(r) in texts for r in range(s["world"]))  # every rank drawn
    boxes = {(round(t.get_position()[0], 2), round(t.get_position()[1], 2))
             for t in fig.axes[0].texts if t.get_text().isdigit()}
    assert len(boxes) == s["world"], "two ranks drawn on the same spot"
