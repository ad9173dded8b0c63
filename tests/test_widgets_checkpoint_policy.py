"""Module 09's checkpoint-policy widget and the measured-stall figure: their numbers are the
cost model's (written out here), their figures labelled, and the sliders move the winner."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest

from parlab import widgets

LLAMA3_H = 54 * 24 / 419  # hours between failures: 419 in 54 days


def test_summary_is_the_model():
    s = widgets.policy_summary(LLAMA3_H, 60, 4, 90, 600)
    m = LLAMA3_H * 3600
    tau_sync, cost_sync = s["best"]["sync"]
    assert tau_sync == pytest.approx(math.sqrt(2 * 60 * m))
    assert cost_sync == pytest.approx(math.sqrt(2 * 60 / m) + 600 / m)
    tau_async, cost_async = s["best"]["async"]
    assert tau_async == pytest.approx(math.sqrt(2 * 4 * m))  # above the 90 s write
    assert cost_async == pytest.approx(math.sqrt(2 * 4 / m) + (90 + 600) / m)
    assert s["winner"].mode == "async"
    assert min(s["curves"]["sync"]) >= cost_sync * (1 - 1e-9)
    assert "Best: <b>async</b>" in widgets.describe_policy(s)


def test_the_policy_figure_is_labelled():
    fig = widgets.plot_policy(widgets.policy_summary(1.0, 120, 10, 900, 600))
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("sync") for t in texts) and any(t.startswith("async") for t in texts)
    assert any("w = 900 s" in t for t in texts)
    notes = [t.get_text() for t in ax.texts]
    assert any(n.startswith("sync best") for n in notes), notes
    plt.close(fig)


def test_a_slower_write_hands_the_win_to_sync():
    w = widgets.policy_explorer(mtbf_h=1.0, sync_save_s=120, async_stall_s=10, async_write_s=60,
                                restart_s=600)
    assert w.summary["winner"].mode == "async"
    w.controls["async_write_s"].value = 900
    assert w.summary["winner"].mode == "sync"
    assert w.summary["best"]["async"][0] == pytest.approx(900)  # held back by its write


def test_the_measured_stalls_figure_names_each_bar():
    measured = [{"sync": 0.2, "async_stall": 0.05, "async_write": 0.3}] * 2
    fig = widgets.plot_save_stalls(measured)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 0, sync", "rank 0, async", "rank 1, sync", "rank 1, async"]
    assert [round(p.get_width(), 6) for p in ax.patches[:3]] == [200.0, 50.0, 300.0]
    assert ax.get_xlabel().startswith("milliseconds") and ax.get_legend() is not None
    plt.close(fig)
