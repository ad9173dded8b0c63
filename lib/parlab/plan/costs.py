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
  holds $\min(p, m)$ micro-batches of $L_s$ layers; under DualPipe-V every rank holds
  $2p+1$ chunks of half its layers (DualPipe's "PP + 1" with PP = 2p stages), $p + \frac12$
  micro-batches of $L_s$ layers, its parameters once. "selective" recomputes the attention
  scores (what flash attention does), keeping $\frac{34 s_c b h}{t}$ per layer; "none" keeps the
  scores too, $5 a s_c s b / t$; "full" keeps each layer's input, $2 s_c b h/t$, plus one layer.
- bytes each GPU sends per optimizer step, by axis:
  TP $m L_s \cdot 16\frac{t-1}{t} b s_c h$ (`costs.tp_bytes_per_layer`);
  CP, ring attention: $m L_s$ times `cp.ring_bytes_per_layer` (K and V of $H_{kv}/t$ heads pass
  the ring c - 1 hops forward; K, V again and dK, dV c hops backward); Ulysses: $m L_s$ times
  `costs.ulysses_bytes_per_layer` (four all-to-alls of $\frac{c-1}{c}$ of q, k, v, out
  forward, four backward);
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

Exposed time (`cp_seconds`, `bubble_seconds`, `pair_hidden_share`): CP's transfers, priced by
`parlab.cp.attention_comm` at the cluster's achievable FLOP/s: the ring exposes what a step's
transfer takes beyond its block's compute, Ulysses all of its all-to-alls. The pipeline's
bubble is $W\frac{p-1}{m}$ for 1F1B ($W$ the busy time of a step) and, for DualPipe-V,
DualPipe's $(p-1)(F\&B + B - 3W)$ with a chunk's forward, input backward and weight backward
each $\frac{W}{6m}$ and a pair costing its forward and full backward: $W\frac{p-1}{3m}$, a
third. DualPipe-V also runs $2m-2p-1$ of every rank's $2m$ chunk forwards paired with a
backward (the last rank's count), hiding that share of the EP and CP transfers under the other
chunk's compute, as far as the compute reaches.
"""

from __future__ import annotations

import math

from parlab import costs
from parlab.costs.activations import REGIONS, activation_breakdown
from parlab.costs.memory import state_breakdown
from parlab.cp.compare import CP_KINDS, attention_comm, ring_bytes_per_layer
from parlab.mesh import AXES, Mesh
from parlab.moe.costs import ep_a2a_bytes
from parlab.plan.types import Cluster, Model, Shape
from parlab.pp.dualpipe import dualpipe_v_bubble

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "dualpipe_v")
"""Pipeline schedules the planner prices (`evaluate(schedule=...)`)."""
__all__ = ["RECOMPUTE", "SCHEDULES", "CP_KINDS", "DP_GROUP", "nodes_spanned", "stage_layers",
           "stage_params", "state_memory", "activation_memory", "axis_bytes", "stage_imbalance",
           "tp_heads", "cp_seconds", "bubble_seconds", "pair_hidden_share"]
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
                      recompute: str, schedule: str = "1f1b") -> float:
    """Bytes of activations the first stage holds at its peak (module docstring)."""
    s_c = max(1, model.seq // shape.cp)
    parts = activation_breakdown(micro_batch, s_c, model.hidden, model.heads, shape.tp, sp=True)
    scores = parts.pop(_SCORES) * shape.cp  # s_c queries of this rank against all s keys
    per_layer = sum(parts.values()) + (scores if recompute == "none" else 0.0)
    held = (shape.pp + 0.5 if schedule == "dualpipe_v" else min(shape.pp, microbatches)) \
        * stage_layers(model, shape.pp)
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


def tp_heads(model: Model, tp: int) -> tuple[int, int]:
    """(query heads, key/value heads) one TP rank holds; K/V heads fewer than t are
    replicated, one per rank."""
    return model.heads // tp, max(1, model.kv // tp)


def _cp_layer_bytes(model: Model, shape: Shape, b: int, cp_kind: str) -> float:
    c, head = shape.cp, model.hidden // model.heads
    q_heads, kv_heads = tp_heads(model, shape.tp)
    if c == 1:
        return 0.0
    if cp_kind == "ulysses":
        return costs.ulysses_bytes_per_layer(b, model.seq, q_heads * head, c,
                                             h_kv=kv_heads * head, backward=True)
    return ring_bytes_per_layer(b, model.seq, kv_heads * head, c, backward=True)


def axis_bytes(model: Model, shape: Shape, *, strategy: str, micro_batch: int,
               microbatches: int, cp_kind: str = "ring") -> dict[str, float]:
    """{axis: bytes one GPU sends per optimizer step} for tp, cp, ep, pp, dp."""
    b, m, h, t = micro_batch, microbatches, model.hidden, shape.tp
    s_c, layers = max(1, model.seq // shape.cp), stage_layers(model, shape.pp)
    out = {"tp": m * layers * costs.tp_bytes_per_layer(b, s_c, h, t),
           "cp": m * layers * _cp_layer_bytes(model, shape, b, cp_kind), "ep": 0.0,
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


def cp_seconds(model: Model, cluster: Cluster, shape: Shape, *, cp_kind: str, micro_batch: int,
               microbatches: int, bandwidth: float) -> float:
    """Seconds per step of CP transfers that the attention compute does not hide
    (`parlab.cp.attention_comm`, forward and backward, at the achievable FLOP/s)."""
    if shape.cp == 1:
        return 0.0
    q_heads, kv_heads = tp_heads(model, shape.tp)
    per_layer = attention_comm(b=micro_batch, s=model.seq, heads=q_heads,
                               head_dim=model.hidden // model.heads, c=shape.cp,
                               flops=cluster.achievable * cluster.flops, bandwidth=bandwidth,
                               kv_heads=kv_heads, backward=True)[f"{cp_kind}_exposed_s"]
    assert isinstance(per_layer, float)
    return microbatches * stage_layers(model, shape.pp) * per_layer


def bubble_seconds(busy: float, p: int, m: int, schedule: str) -> float:
    """The pipeline's idle time per step, given the busy time `busy` of a step (module
    docstring): 1F1B's (p-1)/m of it, DualPipe-V's published form, a third of that."""
    if p == 1:
        return 0.0
    if schedule == "dualpipe_v":
        w = busy / m  # one micro-batch through a rank's two chunks: F 1/3, B and W 1/3 each
        return dualpipe_v_bubble(p, w / 6, w / 3, w / 6, w / 2)
    share = costs.bubble_fraction(p, m)
    return busy * share / (1 - share)


def pair_hidden_share(p: int, m: int, schedule: str) -> float:
    """The share of a rank's chunk forwards DualPipe-V runs paired with a backward (the last
    rank's 2m - 2p - 1 of 2m); 0 for 1F1B."""
    return max(0.0, (2 * m - 2 * p - 1) / (2 * m)) if schedule == "dualpipe_v" else 0.0
