r"""The planner's cost pieces: memory per GPU, bytes per axis, links, stage imbalance.

`parlab.plan` calls these for one candidate shape $(d, p, e, c, t)$ = (dp, pp, ep, cp, tp), with
b the micro-batch, s the sequence, h the hidden size, a the heads, L the layers, m the
micro-batches each pipeline runs per step, $L_s = \lceil L/p \rceil$ the layers of the fullest
stage and $s_c = s/c$ the tokens of a sequence one CP rank holds. Every formula that already
exists in parlab is called, not repeated:

- which GPU: the fullest (`fullest_stage`). The vocabulary sits at both ends of the pipeline
  (Megatron-LM's vocabulary-parallel layers, each TP rank $V/t$ rows): the input embedding's
  $Vh/t$ on the first stage, the output layer's $Vh/t$ and the loss on the last. Every stage
  is given $L_s$ layers (an upper bound where p does not divide L), so the first and last
  stages hold the same parameters (both ends when p = 1, and on DualPipe-V's rank 0, which
  runs the first and the last stage). Under 1F1B the first stage holds the most micro-batches
  of activations and the last one the logits; whichever is larger is the plan's memory.
- state: `memory.state_breakdown` of that stage's parameters, $P_0/t$ for the dense part
  (ZeRO over the dp·cp·ep ranks that share them) and $P_0^{exp}/(e t)$ for the experts (ZeRO
  over dp·cp); $P_0 = L_s P_{layer} + Vh$ with $P_{layer} = (N - N_{exp} - 2Vh)/L$ ($2Vh$
  when one rank holds both ends). ZeRO-3 adds two layers of gathered weights (the one
  computing and the one prefetched), bf16, or FP8 under precision="fp8".
- activations (`activations.activation_breakdown`, TP + SP as Megatron runs it, the QKV and
  fc1 inputs kept as sequence shards and gathered again in backward; bf16): under 1F1B the
  first stage holds $\min(p, m)$ micro-batches of $L_s$ layers and the last stage one (it
  starts each micro-batch's backward right after its forward); under DualPipe-V every rank holds
  $2p+1$ chunks of half its layers (DualPipe's "PP + 1" with PP = 2p stages), $p + \frac12$
  micro-batches of $L_s$ layers, its parameters once. "selective" recomputes the attention
  scores (what flash attention does), keeping $\frac{34 s_c b h}{t}$ per layer ($27$ under FP8,
  `costs.precision`); "none" keeps the scores too, $5 a s_c s b / t$; "full" keeps each
  layer's input, $2 s_c b h/t$, plus one layer.
- logits (`activations.logits_bytes`): the stage that computes the loss keeps one
  micro-batch's fp32 logits, $4 b s_c V/t$ under the vocabulary-parallel cross-entropy.
- bytes each GPU sends per optimizer step, by axis:
  TP with SP $m L_s \cdot 20\frac{t-1}{t} b s_c h$: 6 all-gathers (the backward's two
  re-gathers of the LayerNorm outputs among them, which the $34 s_c b h/t$ of activations
  assumes) and 4 reduce-scatters, `costs.precision.tp_bytes_by_collective`; $14\frac{t-1}{t}$
  under FP8, its all-gathers in FP8. regather=False prices GEMMs that keep the gathered input
  instead: plain TP's $16\frac{t-1}{t}$ (`costs.tp_bytes_per_layer`), as module 07's exercise 2
  does;
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
  what it saves), its weight all-gathers in FP8 under precision="fp8"
  (`costs.precision.fsdp_bytes_by_collective`).

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
from parlab.costs.activations import PRECISIONS, REGIONS, activation_breakdown, logits_bytes
from parlab.costs.memory import state_breakdown
from parlab.costs.precision import (
    GEMM_INPUT_BYTES,
    fsdp_bytes_by_collective,
    tp_bytes_by_collective,
)
from parlab.cp.compare import CP_KINDS, attention_comm, ring_bytes_per_layer
from parlab.mesh import AXES, Mesh
from parlab.moe.costs import ep_a2a_bytes
from parlab.plan.types import Cluster, Model, Shape
from parlab.pp.dualpipe import dualpipe_v_bubble

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "dualpipe_v")
"""Pipeline schedules the planner prices (`evaluate(schedule=...)`)."""
__all__ = ["RECOMPUTE", "SCHEDULES", "CP_KINDS", "PRECISIONS", "STAGES", "DP_GROUP",
           "nodes_spanned", "stage_layers", "stage_params", "state_memory", "activation_memory",
           "logits_memory", "stage_memory", "fullest_stage", "axis_bytes", "stage_imbalance",
           "tp_heads", "cp_seconds", "bubble_seconds", "pair_hidden_share"]
_SCORES = next(name for name, (coef, _) in REGIONS.items() if coef == "scores")

STAGES = ("first", "last")
"""The two ends of a pipeline whose memory the planner compares (`stage_memory`)."""
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


def _both_ends(pp: int, schedule: str) -> bool:
    """One rank runs the first and the last stage: no pipeline, or DualPipe-V's rank 0."""
    return pp == 1 or schedule == "dualpipe_v"


def stage_params(model: Model, pp: int, *, schedule: str = "1f1b") -> tuple[float, float]:
    """(dense, expert) parameters of the first (or last) pipeline stage, before any sharding:
    $L_s$ layers and one $Vh$, both when one rank holds both ends (module docstring)."""
    embed = model.embedding_params
    per_layer = (model.n_params - model.expert_params - 2 * embed) / model.layers
    share = stage_layers(model, pp) / model.layers
    dense = per_layer * stage_layers(model, pp) + embed * (2 if _both_ends(pp, schedule) else 1)
    return dense, model.expert_params * share


def state_memory(model: Model, shape: Shape, strategy: str, *, schedule: str = "1f1b",
                 precision: str = "bf16") -> dict[str, float]:
    """{part: bytes} of weights, gradients, optimizer state (+ gathered weights for ZeRO-3)."""
    dense, expert = stage_params(model, shape.pp, schedule=schedule)
    out = state_breakdown(dense / shape.tp, strategy, shape.dp * shape.ep * shape.cp)
    if expert:
        moe = state_breakdown(expert / (shape.ep * shape.tp), strategy, shape.dp * shape.cp)
        out = {part: out[part] + moe[part] for part in out}
    if strategy in ("zero3", "fsdp"):
        layer = (dense / shape.tp + expert / (shape.ep * shape.tp)) / stage_layers(model, shape.pp)
        out["gathered weights"] = 2 * GEMM_INPUT_BYTES[precision] * layer
    return out


def activation_memory(model: Model, shape: Shape, *, micro_batch: int, microbatches: int,
                      recompute: str, schedule: str = "1f1b", stage: str = "first",
                      precision: str = "bf16", regather: bool = True) -> float:
    """Bytes of activations a stage's layers hold at its peak, the logits apart (module
    docstring): under 1F1B min(p, m) micro-batches on the first stage, one on the last.
    regather=False: the QKV and fc1 inputs kept gathered, whole (`activation_breakdown`)."""
    s_c = max(1, model.seq // shape.cp)
    parts = activation_breakdown(micro_batch, s_c, model.hidden, model.heads, shape.tp, sp=True,
                                 precision=precision, regather=regather)
    scores = parts.pop(_SCORES) * shape.cp  # s_c queries of this rank against all s keys
    per_layer = sum(parts.values()) + (scores if recompute == "none" else 0.0)
    in_flight = min(shape.pp, microbatches) if stage == "first" else 1
    held = (shape.pp + 0.5 if schedule == "dualpipe_v" else in_flight) \
        * stage_layers(model, shape.pp)
    if recompute == "full":
        return held * 2 * micro_batch * s_c * model.hidden / shape.tp + per_layer
    return held * per_layer


def logits_memory(model: Model, shape: Shape, *, micro_batch: int, stage: str = "first",
                  schedule: str = "1f1b") -> float:
    """fp32 logits the stage keeps for the loss's backward: one micro-batch's $4 b s_c V/t$
    (vocabulary-parallel) on the stage that computes the loss, else 0."""
    if not model.vocab or (stage == "first" and not _both_ends(shape.pp, schedule)):
        return 0.0
    return logits_bytes(micro_batch, max(1, model.seq // shape.cp), model.vocab, shape.tp)


def stage_memory(model: Model, shape: Shape, *, strategy: str, micro_batch: int,
                 microbatches: int, recompute: str, schedule: str = "1f1b",
                 stage: str = "first", precision: str = "bf16",
                 regather: bool = True) -> dict[str, float]:
    """{part: bytes} per GPU of one stage: state, activations and "logits"."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: use one of {', '.join(STAGES)}")
    out = state_memory(model, shape, strategy, schedule=schedule, precision=precision)
    out["activations"] = activation_memory(model, shape, micro_batch=micro_batch,
                                           microbatches=microbatches, recompute=recompute,
                                           schedule=schedule, stage=stage, precision=precision,
                                           regather=regather)
    out["logits"] = logits_memory(model, shape, micro_batch=micro_batch, stage=stage,
                                  schedule=schedule)
    return out


def fullest_stage(model: Model, shape: Shape, *, strategy: str, micro_batch: int,
                  microbatches: int, recompute: str, schedule: str = "1f1b",
                  precision: str = "bf16", regather: bool = True
                  ) -> tuple[str, dict[str, float]]:
    """(which, {part: bytes}) of the fullest GPU (`stage_memory`'s parts): "only" when p = 1,
    "first and last" on DualPipe-V's rank 0, else the first or the last stage, whichever
    holds more (the first on a tie; both hold the same state)."""
    state = state_memory(model, shape, strategy, schedule=schedule, precision=precision)

    def at(stage: str) -> dict[str, float]:
        act = activation_memory(model, shape, micro_batch=micro_batch, microbatches=microbatches,
                                recompute=recompute, schedule=schedule, stage=stage,
                                precision=precision, regather=regather)
        logits = logits_memory(model, shape, micro_batch=micro_batch, stage=stage,
                               schedule=schedule)
        return {**state, "activations": act, "logits": logits}

    first = at("first")
    if _both_ends(shape.pp, schedule):
        return ("only" if shape.pp == 1 else "first and last"), first
    last = at("last")
    return ("last", last) if sum(last.values()) > sum(first.values()) else ("first", first)


def _dp_bytes(n_params: float, strategy: str, group: int, microbatches: int,
              precision: str) -> float:
    if n_params <= 0 or group == 1:
        return 0.0
    if strategy == "zero2":
        grads = n_params * 2
        return (microbatches * costs.ring_reduce_scatter_bytes(grads, group)
                + costs.ring_allgather_bytes(grads, group))
    if strategy in ("zero3", "fsdp"):
        per_pass = fsdp_bytes_by_collective(n_params, group, precision=precision)
        return microbatches * sum(per_pass.values())
    return costs.dp_traffic_bytes(n_params, strategy, group)


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
               microbatches: int, cp_kind: str = "ring", schedule: str = "1f1b",
               precision: str = "bf16", regather: bool = True) -> dict[str, float]:
    """{axis: bytes one GPU of the fullest stage sends per optimizer step} for tp, cp, ep, pp,
    dp (module docstring); regather=False: TP + SP without the backward's re-gathers."""
    b, m, h, t = micro_batch, microbatches, model.hidden, shape.tp
    s_c, layers = max(1, model.seq // shape.cp), stage_layers(model, shape.pp)
    tp_layer = sum(tp_bytes_by_collective(b, s_c, h, t, precision=precision,
                                          regather=regather).values())
    out = {"tp": m * layers * tp_layer,
           "cp": m * layers * _cp_layer_bytes(model, shape, b, cp_kind), "ep": 0.0,
           "pp": m * 2 * (2 * b * s_c * h / t) if shape.pp > 1 else 0.0}
    if model.experts and shape.ep > 1:
        moe_layers = math.ceil(model.moe_layer_count / shape.pp)
        a2a = ep_a2a_bytes(max(1, b * s_c // t), h, shape.ep, num_experts=model.experts,
                           k=model.top_k, capacity_factor=1.0)
        out["ep"] = m * moe_layers * 2 * a2a
    dense, expert = stage_params(model, shape.pp, schedule=schedule)
    out["dp"] = (_dp_bytes(dense / t, strategy, shape.dp * shape.ep * shape.cp, m, precision)
                 + _dp_bytes(expert / (shape.ep * t), strategy, shape.dp * shape.cp, m,
                             precision))
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
