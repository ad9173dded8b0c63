r"""Module 07 widget: the parallelism planner, its ranked table and the chosen plan's topology.

Same pattern as `parlab.widgets` (Explorer):

    planner_summary(params_b, layers, ..., global_batch, micro_batch, choice) -> summary dict
        (numbers from parlab.plan.plan: "plans", "kept", "rejected", "chosen", ...)
    describe_planner(summary) -> str   (HTML: top kept plans, then rejected ones with reasons)
    plot_planner(summary) -> Figure    (parlab.plan.draw_plan of the chosen plan)
    planner_widget(preset) -> Planner  (an Explorer with a preset dropdown, `.preset`)

Sizes are typed in the units people quote: parameters in billions, memory in GB, links in
GB/s per direction (NVLink's 900 GB/s datasheet figure is 450 each way), FLOP/s in TFLOP/s,
and the share of that peak the matmuls sustain (`Cluster.achievable`) in percent.
"choice" picks which kept plan (1 = best) the drawing shows; "precision" plans in bf16 or
FP8 (`parlab.costs.precision`: FP8 activations and TP/ZeRO-3 all-gathers). The table's MFU is
the model's 6N FLOPs per token at the step's rate, over the GPUs' peak (`parlab.plan.Plan.mfu`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from parlab import plan as planner
from parlab.plan.topology import draw_plan
from parlab.plan.types import Cluster, Model, Plan
from parlab.widgets.explorer import Explorer, Summary

_STYLE = {"description_width": "9em"}
# control name -> (object, field, scale from the field's unit to the control's)
_FIELDS = {
    "params_b": ("model", "n_params", 1e-9), "layers": ("model", "layers", 1),
    "hidden": ("model", "hidden", 1), "heads": ("model", "heads", 1),
    "seq": ("model", "seq", 1), "vocab": ("model", "vocab", 1),
    "experts": ("model", "experts", 1), "top_k": ("model", "top_k", 1),
    "expert_params_b": ("model", "expert_params", 1e-9),
    "gpus": ("cluster", "gpus", 1), "gpus_per_node": ("cluster", "gpus_per_node", 1),
    "memory_gb": ("cluster", "memory", 1e-9), "intra_gbps": ("cluster", "intra_bw", 1e-9),
    "inter_gbps": ("cluster", "inter_bw", 1e-9), "tflops": ("cluster", "flops", 1e-12),
    "achievable_pct": ("cluster", "achievable", 100),
}
_MODEL_FIELDS = sum(owner == "model" for owner, _, _ in _FIELDS.values())


def _same(a: Any, b: Any) -> bool:
    """Equal numbers (to rounding) in every numeric field: names do not count."""
    return all(math.isclose(getattr(a, f.name), getattr(b, f.name))
               for f in dataclasses.fields(a) if not isinstance(getattr(a, f.name), str))


def _build(values: dict[str, Any], like: tuple[Model, Cluster]) -> tuple[Model, Cluster]:
    """Model and Cluster from the controls; a preset's own objects when nothing was edited."""
    kwargs: dict[str, dict[str, Any]] = {"model": {}, "cluster": {}}
    for name, (owner, field, scale) in _FIELDS.items():
        value = values[name] / scale
        kwargs[owner][field] = round(value) if isinstance(values[name], int) else value
    model = Model("custom model", **kwargs["model"])
    c = kwargs["cluster"]
    cluster = Cluster(f"{c['gpus']} GPUs, {c['gpus_per_node']} per node", **c)
    return (like[0] if _same(model, like[0]) else model,
            like[1] if _same(cluster, like[1]) else cluster)


def planner_summary(*, like: tuple[Model, Cluster] = (planner.PRACTICE_70B, planner.H100_32),
                    global_batch: int, micro_batch: int, choice: int, precision: str = "bf16",
                    **fields: Any) -> Summary:
    """Keys: "model", "cluster", "plans" (ranked), "kept", "rejected", "chosen" (the
    choice-th kept plan, or None), "global_batch", "micro_batch"; or "error" (a message) when
    the inputs are invalid. `fields` are the _FIELDS controls' values."""
    try:
        model, cluster = _build(fields, like)
        plans = planner.plan(model, cluster, global_batch=global_batch, micro_batch=micro_batch,
                             precision=precision)
    except ValueError as error:
        return {"error": str(error)}
    kept = [p for p in plans if p.kept]
    return {"model": model, "cluster": cluster, "plans": plans, "kept": kept,
            "rejected": [p for p in plans if not p.kept], "global_batch": global_batch,
            "micro_batch": micro_batch,
            "chosen": kept[min(choice, len(kept)) - 1] if kept else None}


def _row(rank: str, p: Plan) -> str:
    tp = p.axis("tp")
    where = tp.link if tp else "—"
    return (f"<tr><td>{rank}</td><td>{p.label}</td><td>{p.memory_total / 1e9:,.1f}</td>"
            f"<td>{p.bubble:.1%}</td><td>{p.step_s:,.2f}</td><td>{p.mfu:.0%}</td>"
            f"<td>{where}</td></tr>")


def describe_planner(s: Summary, *, top: int = 5) -> str:
    if "error" in s:
        return f"<b>cannot plan:</b> {s['error']}"
    head = ("<tr><th>#</th><th>plan</th><th title='GB per GPU of the fullest pipeline stage: "
            "the first one's activations or the last one's fp32 logits'>GB/GPU</th>"
            "<th>bubble</th><th>step s</th>"
            "<th title='model FLOPs utilisation: 6N FLOPs per token at the step rate, over "
            "the peak'>MFU</th><th>TP link</th></tr>")
    rows = [_row(str(i), p) for i, p in enumerate(s["kept"][:top], 1)]
    rows += [_row("✗", p) + f"<tr><td></td><td colspan=6><i>{'; '.join(p.reasons)}</i></td></tr>"
             for p in s["rejected"][:top]]
    chosen = s["chosen"]
    why = ("<br>".join(chosen.reasons) if chosen else
           "no plan fits: add GPUs, recompute, or shrink the micro-batch")
    return (f"<b>{s['model'].name}</b> on <b>{s['cluster'].name}</b>, global batch "
            f"{s['global_batch']:,} × {s['model'].seq:,} tokens: {len(s['kept'])} of "
            f"{len(s['plans'])} plans kept; matmuls at {s['cluster'].achievable:.0%} of peak, "
            f"so MFU is at most that<table>{head}{''.join(rows)}</table>"
            f"<b>drawn:</b> {chosen.label if chosen else '—'}<br>{why}")


def plot_planner(s: Summary) -> Figure:
    if s.get("chosen") is not None:
        return draw_plan(s["chosen"], s["cluster"])
    fig, ax = plt.subplots(figsize=(8, 2), layout="constrained")
    ax.text(0.5, 0.5, s.get("error", "no plan fits in memory: see the rejected plans"),
            ha="center", va="center", wrap=True)
    ax.set_title("nothing to draw")
    ax.axis("off")
    return fig


def _controls(model: Model, cluster: Cluster, batch: int) -> dict[str, widgets.ValueWidget]:
    out: dict[str, widgets.ValueWidget] = {}
    for name, (owner, field, scale) in _FIELDS.items():
        value = getattr(model if owner == "model" else cluster, field) * scale
        box = widgets.FloatText if scale != 1 else widgets.IntText
        label = name.replace("_pct", " %").replace("_", " ")
        out[name] = box(value=value, description=label, style=_STYLE,
                        continuous_update=False, layout=widgets.Layout(width="17em"))
    out["global_batch"] = widgets.IntText(value=batch, description="global batch",
                                          style=_STYLE, layout=widgets.Layout(width="17em"))
    out["micro_batch"] = widgets.BoundedIntText(value=1, min=1, max=64, description="micro-batch",
                                                style=_STYLE, layout=widgets.Layout(width="17em"))
    out["choice"] = widgets.BoundedIntText(value=1, min=1, max=50, description="draw plan #",
                                           style=_STYLE, layout=widgets.Layout(width="17em"))
    out["precision"] = widgets.Dropdown(options=list(planner.PRECISIONS), value="bf16",
                                        description="precision", style=_STYLE,
                                        layout=widgets.Layout(width="17em"))
    return out


class Planner(Explorer):
    """The Explorer with a preset dropdown (`.preset`) that fills every field at once."""

    def __init__(self, preset: str):
        self.preset = widgets.Dropdown(options=list(planner.PRESETS), value=preset,
                                       description="preset", style=_STYLE,
                                       layout=widgets.Layout(width="36em"))
        self._holding = False
        super().__init__(_controls(*planner.PRESETS[preset]), self._compute, describe_planner,
                         plot_planner, header=(self.preset,))
        self.preset.observe(self._apply_preset, names="value")
        n_model, n_all = _MODEL_FIELDS, len(_FIELDS)
        column = [list(self.controls.values())[i:j]
                  for i, j in ((0, n_model), (n_model, n_all), (n_all, n_all + 4))]
        self.children = (self.preset, widgets.HBox([widgets.VBox(c) for c in column]),
                         self.html, self.output)

    def _compute(self, **values: Any) -> Summary:
        model, cluster, _ = planner.PRESETS[self.preset.value]
        return planner_summary(like=(model, cluster), **values)

    def refresh(self, _change: object = None) -> None:
        if not self._holding:
            super().refresh()

    def _apply_preset(self, change: dict) -> None:
        fresh = _controls(*planner.PRESETS[change["new"]])
        self._holding = True
        try:
            for name, control in fresh.items():
                if name not in ("choice", "precision"):
                    self.controls[name].value = control.value
        finally:
            self._holding = False
        self.refresh()


def planner_widget(preset: str = next(iter(planner.PRESETS))) -> Planner:
    """The planner: defaults are module 07's practice problem 1 (70B on 32 H100s)."""
    return Planner(preset)
