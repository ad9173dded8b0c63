r"""The planner's cost pieces: memory per GPU, bytes per axis, links, stage imbalance.

`parlab.plan` calls these for one candidate shape $(d, p, e, c, t)$ = (dp, pp, ep, cp, tp), with
b the micro-batch, s the sequence, h the hidden size, a the heads, L the layers, m the
micro-batches each pipeline runs per step, $L_s = \lceil L/p \rceil$ the layers of the fullest
stage and $s_c = s/c$ the tokens of a sequence one CP rank holds. Every formula that already
exists in parlab is called, not repeated:

- state: `memory.state_breakdown` of the first stage's parameters, $P_0/t$ for the dense part
  (ZeRO over the dp·cp·ep ranks that share them) and $P_0^{exp}/(e t)$ for the experts (ZeRO
  over dp·cp); $P_0 = L_s P_{layer} + Vh$ with $P_{layer} = (N - N_{exp} - 2Vh)/L$ (the input
  embedding lives on the first stage; with p = 1 the output layer's Vh as well). ZeRO-3 adds
  two layers of gathered bf16 weights (the one computing and the one prefetched).
- activations (`activations.activation_breakdown`, TP + SP, bf16): under 1F1B the first stage
  holds $\min(p, m)$ micro-batches of $L_s$ layers. "selective" recomputes the attention
  scores (what flash attention does), keeping $\frac{34 s_c b h}{t}$ per layer; "none" keeps the
  scores too, $5 a s_c s b / t$; "full" keeps each layer's input, $2 s_c b h/t$, plus one layer.
- bytes each GPU sends per optimizer step, by axis:
  TP $m L_s \cdot 16\frac{t-1}{t} b s_c h$ (`costs.tp_bytes_per_layer`);
  CP $m L_s \cdot 3(c-1) \cdot b\,2 s_c \frac{h}{a}\frac{a}{t} \cdot 2$ (ring attention: K and V
  pass the ring in forward, K, V, dK, dV in backward; `cp_layout.block_bytes`);
  EP $m \lceil L_{moe}/p \rceil \cdot 2 \cdot$ `moe_costs.ep_a2a_bytes` (dispatch + combine,
  forward and backward, capacity factor 1, tokens $b s_c / t$ per rank under SP);
  PP $m \cdot 2 \cdot 2 b s_c h / t$ (one activation forward, one gradient backward, bf16,
  scatter-gather over TP);
  DP `costs.dp_traffic_bytes` once a step for ddp and zero1; zero2 reduce-scatters the
  gradients every micro-batch and gathers the weights once; zero3 gathers and reduce-scatters
  every micro-batch (holding unsharded weights or gradients across micro-batches would undo
  what it saves).

Which link an axis rides comes from the rank grid (`parlab.mesh`, TP innermost): a group stays
on NVLink when all its ranks r share r // gpus_per_node.
"""

from __future__ import annotations

import math

from parlab import costs
from parlab.costs.activations import REGIONS, activation_breakdown
from parlab.costs.memory import state_breakdown
from parlab.cp.layout import block_bytes
from parlab.mesh import AXES, Mesh
from parlab.moe.costs import ep_a2a_bytes
from parlab.plan.types import Model, Shape

RECOMPUTE = ("none", "selective", "full")
_SCORES = next(name for name, (coef, _) in REGIONS.items() if coef == "scores")

DP_GROUP = ("dp", "ep", "cp")
"""The dense weights' replicas: their gradients are reduced over dp·ep·cp ranks."""


def nodes_spanned(mesh: Mesh, axes: tuple[str, ...], gpus_per_node: int) -> int:
    """Most nodes any group along `axes` touches (1: every group stays inside a node).

    Along a line of the grid ranks only grow, so a group's node count is one plus the number
    of times r // gpus_per_node changes along it."""
    dims = [AXES.index(a) for a in AXES if a in axes]
    rest = [i for i in range(len(AXES)) if i not in dims]
    size = math.prod(mesh.grid.shape[i] for i in dims)
    nodes = mesh.grid.permute(*rest, *dims).reshape(-1, size) // gpus_per_node
    return 1 + int((nodes.diff(dim=1) != 0).sum(dim=1).max()) if size > 1 else 1


def stage_layers(model: Model, pp: int) -> int:
    return math.ceil(model.layers / pp)


def stage_params(model: Model, pp: int) -> tuple[float, float]:
    """(dense, expert) parameters of the first pipeline stage, before any sharding."""
    embed = model.embedding_params
    per_layer = (model.n_params - model.expert_params - 2 * embed) / model.layers
    share = stage_layers(model, pp) / model.layers
    dense = per_layer * stage_layers(model, pp) + embed * (2 if pp == 1 else 1)
    return dense, model.expert_params * share


def state_memory(model: Model, shape: Shape, strategy: str) -> dict[str, float]:
    """{part: bytes} of weights, gradients, optimizer state (+ gathered weights for ZeRO-3)."""
    dense, expert = stage_params(model, shape.pp)
    out = state_breakdown(dense / shape.tp, strategy, shape.dp * shape.ep * shape.cp)
    if expert:
        moe = state_breakdown(expert / (shape.ep * shape.tp), strategy, shape.dp * shape.cp)
        out = {part: out[part] + moe[part] for part in out}
    if strategy in ("zero3", "fsdp"):
        layer = (dense / shape.tp + expert / (shape.ep * shape.tp)) / stage_layers(model, shape.pp)
        out["gathered weights"] = 2 * 2 * layer
    return out


def activation_memory(model: Model, shape: Shape, *, micro_batch: int, microbatches: int,
                      recompute: str) -> float:
    """Bytes of activations the first stage holds at its peak under 1F1B (module docstring)."""
    s_c = max(1, model.seq // shape.cp)
    parts = activation_breakdown(micro_batch, s_c, model.hidden, model.heads, shape.tp, sp=True)
    scores = parts.pop(_SCORES) * shape.cp  # s_c queries of this rank against all s keys
    per_layer = sum(parts.values()) + (scores if recompute == "none" else 0.0)
    held = min(shape.pp, microbatches) * stage_layers(model, shape.pp)
    if recompute == "full":
        return held * 2 * micro_batch * s_c * model.hidden / shape.tp + per_layer
    return held * per_layer


def _dp_bytes(n_params: float, strategy: str, group: int, microbatches: int) -> float:
    if n_params <= 0 or group == 1:
        return 0.0
    if strategy == "zero2":
        grads = n_params * 2
        return (microbatches * costs.ring_reduce_scatter_bytes(grads, group)
                + costs.ring_allgather_bytes(grads, group))
    per_step = costs.dp_traffic_bytes(n_params, strategy, group)
    return per_step * (microbatches if strategy in ("zero3", "fsdp") else 1)


def axis_bytes(model: Model, shape: Shape, *, strategy: str, micro_batch: int,
               microbatches: int) -> dict[str, float]:
    """{axis: bytes one GPU sends per optimizer step} for tp, cp, ep, pp, dp."""
    b, m, h, t = micro_batch, microbatches, model.hidden, shape.tp
    s_c, layers = max(1, model.seq // shape.cp), stage_layers(model, shape.pp)
    # K and V of s_c tokens for this rank's a/t heads of h/a features: linear in h/t
    kv = b * block_bytes(s_c, head_dim=1, heads=1) * h / t
    out = {"tp": m * layers * costs.tp_bytes_per_layer(b, s_c, h, t),
           "cp": m * layers * 3 * (shape.cp - 1) * kv, "ep": 0.0,
           "pp": m * 2 * (2 * b * s_c * h / t) if shape.pp > 1 else 0.0}
    if model.experts and shape.ep > 1:
        moe_layers = math.ceil(model.moe_layer_count / shape.pp)
        a2a = ep_a2a_bytes(max(1, b * s_c // t), h, shape.ep, num_experts=model.experts,
                           k=model.top_k, capacity_factor=1.0)
        out["ep"] = m * moe_layers * 2 * a2a
    dense, expert = stage_params(model, shape.pp)
    out["dp"] = (_dp_bytes(dense / t, strategy, shape.dp * shape.ep * shape.cp, m)
                 + _dp_bytes(expert / (shape.ep * t), strategy, shape.dp * shape.cp, m))
    return out


def stage_imbalance(model: Model, pp: int) -> float:
    r"""Work of the busiest stage over the average: $p\frac{L_s + v}{L + v}$, where the output
    layer costs $v = Vh / P_{layer}$ layers (active parameters); 1 without PP."""
    embed = model.embedding_params
    per_layer = (model.active_params - 2 * embed) / model.layers
    head = embed / per_layer
    return pp * (stage_layers(model, pp) + head) / (model.layers + head)
