"""The planner widget and the topology drawing: numbers from parlab.plan, a figure, a refresh."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from parlab import plan  # noqa: E402
from parlab.plan import topology
from parlab.widgets import planner_widget  # noqa: E402

MTNLG = "MT-NLG 530B on 512 H100 (the TP 8 × PP 8 × DP 8 quiz)"


def legend_texts(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_default_is_practice_problem_1_and_matches_the_planner():
    w = planner_widget()
    expected = plan.plan(plan.PRACTICE_70B, plan.H100_32, global_batch=1024)
    assert w.summary["model"] is plan.PRACTICE_70B and w.summary["cluster"] is plan.H100_32
    assert w.summary["plans"] == expected
    assert w.summary["chosen"] == plan.best(expected)
    assert w.summary["chosen"].label in w.html.value
    assert "✗" in w.html.value and "memory" in w.html.value  # rejected rows say why
    ax = w.figure.axes[0]
    assert ax.get_title().startswith(w.summary["chosen"].label)
    assert ax.get_legend() is not None


def test_changing_a_control_replans_and_redraws():
    w = planner_widget()
    before = w.figure
    w.controls["global_batch"].value = 512
    assert w.summary["plans"] == plan.plan(plan.PRACTICE_70B, plan.H100_32, global_batch=512)
    assert w.figure is not before
    w.controls["choice"].value = 2
    assert w.summary["chosen"] == w.summary["kept"][1]
    assert w.figure.axes[0].get_title().startswith(w.summary["kept"][1].label)
    w.controls["hidden"].value = 4096
    assert w.summary["model"].name == "custom model" and w.summary["model"].hidden == 4096


def test_preset_fills_every_field_and_draws_a_slice_of_a_big_cluster():
    w = planner_widget()
    w.preset.value = MTNLG
    chosen = w.summary["chosen"]
    assert (chosen.tp, chosen.pp, chosen.dp) == (8, 8, 8)
    assert w.controls["params_b"].value == pytest.approx(530)
    assert w.controls["gpus"].value == 512 and w.controls["global_batch"].value == 1920
    assert w.figure.axes[0].get_title().endswith("showing 4 of 64 nodes")
    legend = legend_texts(w.figure)
    assert any(t.startswith("TP 8 · NVLink (inside a node)") for t in legend)
    assert any(t.startswith("PP 8 · InfiniBand (spans 8 nodes)") for t in legend)
    assert any(t.startswith("DP 8 · InfiniBand (spans 8 nodes)") for t in legend)


def test_invalid_input_or_nothing_fitting_is_said_not_drawn():
    w = planner_widget()
    w.controls["layers"].value = 0
    assert "cannot plan" in w.html.value and "Model.layers" in w.html.value
    assert w.figure.axes[0].get_title() == "nothing to draw"
    w.controls["layers"].value = 80
    w.controls["params_b"].value = 1e5
    assert not w.summary["kept"] and "no plan fits" in w.html.value
    assert w.figure.axes[0].get_title() == "nothing to draw"


def test_topology_labels_every_gpu_and_outlines_tp_groups():
    p = plan.evaluate(plan.PRACTICE_70B, plan.H100_32, dp=4, tp=8, recompute="full",
                      global_batch=1024)
    fig = topology.draw_plan(p, plan.H100_32)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "d0 p0\nt0" in texts and "d3 p0\nt7" in texts
    assert sum(t.count("\nt") for t in texts) == 32  # one label per GPU
    outlines = [r for r in ax.patches if isinstance(r, Rectangle) and not r.get_fill()]
    assert len(outlines) == 4  # one TP group per node
    assert "showing" not in ax.get_title()
    assert any("InfiniBand (spans 4 nodes)" in t for t in legend_texts(fig))


def test_shown_nodes_include_each_axis_neighbour():
    p = plan.evaluate(plan.MODEL_512, plan.H100_512, dp=8, tp=8, pp=8, global_batch=1920)
    # rank 0's PP neighbour is rank 8 (node 1), its DP neighbour rank 64 (node 8)
    assert topology.shown_nodes(p, plan.H100_512) == [0, 1, 2, 8]
    fig = topology.draw_plan(p, plan.H100_512, max_nodes=2)
    assert fig.axes[0].get_title().endswith("showing 2 of 64 nodes")
    assert any("DP → node 8 (not shown)" in t.get_text() for t in fig.axes[0].texts)


def test_achievable_share_of_peak_bounds_the_mfu():
    w = planner_widget()
    assert w.controls["achievable_pct"].value == pytest.approx(100 * plan.ACHIEVABLE)
    assert "MFU" in w.html.value and "of peak" in w.html.value
    assert all(p.mfu <= plan.ACHIEVABLE + 1e-12 for p in w.summary["kept"])
    w.controls["achievable_pct"].value = 30
    assert w.summary["cluster"].achievable == pytest.approx(0.3)
    assert all(p.mfu <= 0.3 + 1e-12 for p in w.summary["kept"])


def test_precision_and_the_nvl72_preset_replan():
    w = planner_widget()
    w.controls["precision"].value = "fp8"
    assert w.summary["plans"] == plan.plan(plan.PRACTICE_70B, plan.H100_32, global_batch=1024,
                                           precision="fp8")
    assert w.summary["chosen"].label.endswith(", FP8") and "FP8" in w.html.value
    w.preset.value = "Llama 3 405B on 512 GB200 (8 NVL72 racks)"
    assert w.summary["cluster"] is plan.GB200_NVL72_512 and w.controls["gpus_per_node"].value == 64
    assert w.controls["precision"].value == "fp8"  # a preset leaves the precision alone
    assert w.figure.axes[0].get_title().endswith("showing 2 of 8 nodes")
