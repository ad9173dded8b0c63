r"""Module 06 widgets: expert load and drops against the capacity factor; flat against
hierarchical all-to-all.

Same pattern as `parlab.widgets` (Explorer):

    capacity_summary(n_tokens, num_experts, k, skew, capacity_factor) -> summary dict
    describe_capacity(summary) -> str (HTML);  plot_capacity(summary) -> Figure
    capacity_explorer(...) -> Explorer with sliders
    a2a_summary(n_tokens, hidden, k, num_experts, gpus_per_node) -> summary dict
    describe_a2a(summary) -> str;  plot_a2a(summary) -> Figure;  a2a_explorer(...) -> Explorer

The router is skewed on purpose: every token carries a constant feature that the router weighs
by `skew` towards expert 0 (skew 0: an even router on random tokens). Loads and drops come from
`parlab.moe.load_stats` (capacity $c = \lceil \phi N k / E \rceil$, choice-major queue); the
all-to-all costs from `parlab.moe.a2a_cost`.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from parlab.moe.costs import a2a_cost
from parlab.moe.layer import load_stats, route
from parlab.widgets.explorer import Explorer, Summary

PHIS = tuple(round(0.25 * i, 2) for i in range(1, 17))  # capacity factors of the sweep
NODES = (1, 2, 4, 8, 16, 32)


def skewed_routing(n_tokens: int, num_experts: int, k: int, skew: float, *,
                   hidden: int = 16, seed: int = 0) -> torch.Tensor:
    """experts (N, k) of a seeded router whose scores favour expert 0 by `skew`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, hidden, generator=g)
    w = torch.randn(num_experts, hidden, generator=g) / hidden**0.5
    x[:, 0], w[:, 0] = 1.0, 0.0
    w[0, 0] = skew
    return route(x, w, k=k)[1]


def capacity_summary(n_tokens: int, num_experts: int, k: int, skew: float,
                     capacity_factor: float) -> Summary:
    experts = skewed_routing(n_tokens, num_experts, k, skew)
    sweep = [load_stats(experts, num_experts=num_experts, capacity_factor=phi) for phi in PHIS]
    now = load_stats(experts, num_experts=num_experts, capacity_factor=capacity_factor)
    return {"n_tokens": n_tokens, "num_experts": num_experts, "k": k, "skew": skew,
            "capacity_factor": capacity_factor, "stats": now, "phis": list(PHIS),
            "dropped_tokens": [s.dropped_tokens / n_tokens for s in sweep],
            "dropped_assignments": [s.dropped_assignments / (n_tokens * k) for s in sweep]}


def _lost(tokens: int, k: int) -> str:
    """'no token lost its expert', '1 token lost both its experts', '5 tokens lost all 3 of
    their experts': the tokens every one of whose k choices was dropped."""
    one = tokens <= 1
    whose = "its" if one else "their"
    what = (f"{whose} expert" if k == 1 else f"both {whose} experts" if k == 2
            else f"all {k} of {whose} experts")
    if tokens == 0:
        return f"no token lost {what}"
    return (f"<b>{tokens}</b> token{'' if one else 's'} lost {what} (the residual carries "
            f"{'it' if one else 'them'} through)")


def describe_capacity(s: Summary) -> str:
    st = s["stats"]
    return (f"capacity c = ⌈{s['capacity_factor']:g} · {s['n_tokens']} · {s['k']} / "
            f"{s['num_experts']}⌉ = <b>{st.capacity}</b> per expert; busiest expert offered "
            f"{max(st.offered)} (even share {s['n_tokens'] * s['k'] / s['num_experts']:g}); "
            f"<b>{st.dropped_assignments}</b> of {s['n_tokens'] * s['k']} assignments dropped; "
            f"{_lost(st.dropped_tokens, s['k'])}")


def plot_capacity(s: Summary) -> Figure:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    st = s["stats"]
    ids = range(s["num_experts"])
    ax1.bar(ids, st.offered, color="lightgrey", label="offered")
    ax1.bar(ids, st.kept, color="tab:blue", label="kept")
    ax1.axhline(st.capacity, color="tab:red", ls="--", label=f"capacity {st.capacity}")
    ax1.set(xlabel="expert", ylabel="assignments", title=f"tokens per expert, "
            f"capacity factor {s['capacity_factor']:g}")
    ax1.legend(fontsize=8)
    ax2.plot(s["phis"], s["dropped_assignments"], "o-", label="assignments dropped")
    ax2.plot(s["phis"], s["dropped_tokens"], "s-", label="tokens with no expert")
    ax2.axvline(s["capacity_factor"], color="grey", ls=":")
    ax2.set(xlabel="capacity factor φ", ylabel="share", ylim=(0, 1),
            title="drops against the capacity factor")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def capacity_explorer(n_tokens: int = 256, num_experts: int = 8, k: int = 2, skew: float = 1.0,
                      capacity_factor: float = 1.25) -> Explorer:
    style = {"description_width": "10em"}

    def slider(cls: type, description: str, value: float, lo: float, hi: float,
               step: float) -> widgets.ValueWidget:
        return cls(value=value, min=lo, max=hi, step=step, description=description,
                   continuous_update=False, style=style)

    controls = {
        "n_tokens": slider(widgets.IntSlider, "tokens N", n_tokens, 32, 2048, 32),
        "num_experts": widgets.Dropdown(options=[4, 8, 16, 32, 64], value=num_experts,
                                        description="experts E", style=style),
        "k": slider(widgets.IntSlider, "top-k", k, 1, 4, 1),
        "skew": slider(widgets.FloatSlider, "router skew", skew, 0.0, 4.0, 0.25),
        "capacity_factor": slider(widgets.FloatSlider, "capacity factor φ", capacity_factor,
                                  0.25, 4.0, 0.25),
    }
    return Explorer(controls, capacity_summary, describe_capacity, plot_capacity)


def a2a_summary(n_tokens: int, hidden: int, k: int, num_experts: int,
                gpus_per_node: int) -> Summary:
    """The costs at every node count of NODES whose EP degree ep = nodes · gpus_per_node
    divides the experts (each rank holds E/ep whole experts); "left_out": the node counts
    that would give a rank less than one expert (or a fraction). Refuses (ValueError) when no
    node count is possible: fewer experts than the GPUs of one node."""
    if num_experts % gpus_per_node:
        raise ValueError(f"{num_experts} experts on nodes of {gpus_per_node} GPUs: even one node "
                         f"would give its GPUs {num_experts / gpus_per_node:g} experts each; EP "
                         "needs a whole number of experts per GPU")
    fits = [n for n in NODES if num_experts % (n * gpus_per_node) == 0]
    rows = {n: a2a_cost(n_tokens, hidden, k=k, num_experts=num_experts, nodes=n,
                        gpus_per_node=gpus_per_node) for n in fits}
    return {"n_tokens": n_tokens, "hidden": hidden, "k": k, "num_experts": num_experts,
            "gpus_per_node": gpus_per_node, "rows": rows,
            "left_out": [n for n in NODES if n not in rows]}


def _ep(s: Summary, nodes: int) -> str:
    ep = nodes * s["gpus_per_node"]
    per = s["num_experts"] // ep
    return f"ep = {ep}, {per} expert{'s' if per > 1 else ''} per GPU"


def describe_a2a(s: Summary) -> str:
    last = max(s["rows"])
    r = s["rows"][last]
    text = (f"at {last} nodes of {s['gpus_per_node']} GPUs ({_ep(s, last)}): inter-node bytes "
            f"per rank {r['flat']['inter_bytes'] / 2**20:,.1f} MiB flat, "
            f"{r['hierarchical']['inter_bytes'] / 2**20:,.1f} MiB hierarchical; time "
            f"{r['flat']['seconds'] * 1e3:,.2f} ms against "
            f"{r['hierarchical']['seconds'] * 1e3:,.2f} ms (dispatch, one layer)")
    if s["left_out"]:
        eps = [n * s["gpus_per_node"] for n in s["left_out"]]
        text += (f"<br>not shown: {', '.join(map(str, s['left_out']))} nodes (ep = "
                 f"{', '.join(map(str, eps))} ranks for {s['num_experts']} experts): EP gives "
                 "each rank whole experts, so ep must divide E (at most one rank per expert)")
    return text


def plot_a2a(s: Summary) -> Figure:
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    nodes = sorted(s["rows"])
    for name, style in (("flat", "o-"), ("hierarchical", "s-")):
        ax.plot(nodes, [s["rows"][n][name]["seconds"] * 1e3 for n in nodes], style, label=name)
    ax.set(xscale="log", xlabel=f"nodes G (EP degree ep = G × {s['gpus_per_node']})",
           ylabel="ms per dispatch",
           title=f"all-to-all, {s['num_experts']} experts, {s['gpus_per_node']} GPUs per "
                 f"node, k = {s['k']}")
    ax.set_xticks(nodes, [f"{n}\nep {n * s['gpus_per_node']}" for n in nodes])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    return fig


def a2a_explorer(n_tokens: int = 8192, hidden: int = 7168, k: int = 8, num_experts: int = 256,
                 gpus_per_node: int = 8) -> Explorer:
    style = {"description_width": "10em"}
    controls = {
        "n_tokens": widgets.IntSlider(value=n_tokens, min=1024, max=32768, step=1024,
                                      description="tokens per rank", style=style,
                                      continuous_update=False),
        "hidden": widgets.Dropdown(options=[2048, 4096, 7168, 8192], value=hidden,
                                   description="hidden h", style=style),
        "k": widgets.IntSlider(value=k, min=1, max=8, description="top-k", style=style,
                               continuous_update=False),
        "num_experts": widgets.Dropdown(options=[64, 128, 256], value=num_experts,
                                        description="experts E", style=style),
        "gpus_per_node": widgets.Dropdown(options=[4, 8], value=gpus_per_node,
                                          description="GPUs per node", style=style),
    }
    return Explorer(controls, a2a_summary, describe_a2a, plot_a2a)
