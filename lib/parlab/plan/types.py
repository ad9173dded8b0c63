r"""The planner's data: what it is given (`Model`, `Cluster`) and what it returns (`Plan`).

`parlab.plan` builds these; `parlab.plan.costs` computes their numbers. Every field carries a
docstring; sizes are in parameters, tokens, bytes, bytes/s (one direction) and FLOP/s.
MFU (model FLOPs utilisation) is the share of the GPUs' peak FLOP/s that the model's own
arithmetic uses: $\text{MFU} = \frac{6 N_\text{act} \cdot \text{tokens per second}}{G F}$ for
$G$ GPUs of peak $F$, with $6N$ FLOPs per token ($2N$ forward, a multiply and an add per
weight, $4N$ backward, for the input's and the weight's gradients); recomputation does not
count. The planner runs the matmuls at `Cluster.achievable` of peak and adds communication and
the bubble, so its MFU is at most `achievable`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

_HINTS = {
    "n_params": "the parameter count, e.g. 70e9", "layers": "the number of transformer blocks",
    "hidden": "the model width, e.g. 8192", "heads": "the attention heads, e.g. 64",
    "seq": "the sequence length in tokens", "vocab": "the vocabulary size (0 to ignore it)",
    "experts": "routed experts per MoE layer (0 for a dense model)",
    "top_k": "experts per token (0 for a dense model)", "moe_layers": "MoE layers (0: all)",
    "expert_params": "parameters inside the experts (0 for a dense model)",
    "kv_heads": "key/value heads of grouped-query attention, e.g. 8 (0: as many as heads)",
    "gpus": "the number of GPUs", "gpus_per_node": "GPUs per node, e.g. 8",
    "memory": "bytes per GPU, e.g. 80e9", "intra_bw": "bytes/s per direction, e.g. 450e9",
    "inter_bw": "bytes/s per direction, e.g. 50e9", "flops": "FLOP/s per GPU, e.g. 989.4e12",
    "achievable": "the share of peak FLOP/s the matmuls sustain, in (0, 1], e.g. 0.6",
}
ACHIEVABLE = 0.6
"""The share of peak FLOP/s the planner lets a step's matmuls run at, unless a Cluster says
otherwise. An assumption of this course, not a measurement: kernels below peak, launch gaps
and the non-matmul work (norms, softmax, optimizer) all cost time. For scale, published runs
report MFU of 52% (GPT 1T on 3072 A100, arXiv:2104.04473, counting the recomputed forward) and
38-43% (Llama 3 405B on 8,192-16,384 H100, arXiv:2407.21783), communication and bubbles
included."""


def _whole(owner: str, name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{owner}.{name} must be a whole number >= {minimum}, got {value!r}: "
                         f"pass {_HINTS[name]}")


def _positive(owner: str, name: str, value: object, *, zero: bool = False) -> None:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    number = float(value) if isinstance(value, numbers.Real) and real else math.nan
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        raise ValueError(f"{owner}.{name} must be a finite number {'>=' if zero else '>'} 0, "
                         f"got {value!r}: pass {_HINTS[name]}")


@dataclass(frozen=True)
class Model:
    """A transformer to train, in the sizes the planner needs."""

    name: str
    """What tables and titles call it."""
    n_params: float
    """Every parameter, embeddings and experts included (70e9 for a 70B model)."""
    layers: int
    """Transformer blocks L; PP splits them into stages."""
    hidden: int
    """Model width h."""
    heads: int
    """Attention (query) heads a; TP splits them, so t must divide a."""
    seq: int
    """Training sequence length s in tokens; CP splits it."""
    vocab: int = 0
    """Vocabulary V: V·h embedding parameters sit on the first stage and the V·h output layer's
    compute on the last; 0 ignores both (weights spread evenly over the layers)."""
    experts: int = 0
    """Routed experts per MoE layer E; 0 for a dense model. EP splits them."""
    top_k: int = 0
    """Routed experts each token visits, k (MoE only)."""
    expert_params: float = 0.0
    """Parameters inside routed experts, all layers together; EP shards them."""
    moe_layers: int = 0
    """Layers that carry an MoE block; 0 means all of them when experts > 0."""
    kv_heads: int = 0
    """Key/value heads H_kv (grouped-query attention); 0 means as many as `heads`. Ring
    attention sends K and V of these; Ulysses needs the CP degree to divide them."""

    def __post_init__(self) -> None:
        _positive("Model", "n_params", self.n_params)
        for name in ("layers", "hidden", "heads", "seq"):
            _whole("Model", name, getattr(self, name))
        for name in ("vocab", "experts", "top_k", "moe_layers", "kv_heads"):
            _whole("Model", name, getattr(self, name), minimum=0)
        if self.kv_heads and self.heads % self.kv_heads:
            raise ValueError(f"Model.kv_heads={self.kv_heads} must divide heads={self.heads}: "
                             "each key/value head serves a whole group of query heads")
        _positive("Model", "expert_params", self.expert_params, zero=True)
        if (self.experts > 0) != (self.top_k > 0) or (self.experts > 0) != (self.expert_params > 0):
            raise ValueError("Model: an MoE needs experts, top_k and expert_params all > 0 (a "
                             "dense model leaves all three at 0)")
        if self.top_k > self.experts or self.moe_layers > self.layers:
            raise ValueError("Model: top_k must be <= experts and moe_layers <= layers")
        if self.n_params <= self.expert_params + 2 * self.vocab * self.hidden:
            raise ValueError(f"Model.n_params={self.n_params:.4g} leaves no parameters for the "
                             "layers once the experts and the 2·vocab·hidden embeddings are "
                             "taken out: check the units (70e9, not 70)")

    @property
    def kv(self) -> int:
        """Key/value heads (`heads` unless grouped-query attention says fewer)."""
        return self.kv_heads or self.heads

    @property
    def moe_layer_count(self) -> int:
        return (self.moe_layers or self.layers) if self.experts else 0

    @property
    def active_params(self) -> float:
        """Parameters one token uses: the experts count k/E of theirs."""
        share = self.top_k / self.experts if self.experts else 0.0
        return self.n_params - self.expert_params * (1 - share)

    @property
    def embedding_params(self) -> float:
        return float(self.vocab * self.hidden)


@dataclass(frozen=True)
class Cluster:
    """GPUs in nodes: a fast link inside a node, a slower one between nodes."""

    name: str
    """What tables and titles call it."""
    gpus: int
    """GPUs in all; a multiple of gpus_per_node."""
    gpus_per_node: int
    """GPUs that share the fast link (one NVLink domain)."""
    memory: float
    """Bytes of memory per GPU (80e9 for an H100 80 GB)."""
    intra_bw: float
    """Bytes/s one GPU sends inside its node, ONE direction (H100 NVLink: 450e9; the 900 GB/s
    on the datasheet counts both directions)."""
    inter_bw: float
    """Bytes/s one GPU sends to another node, one direction (one 400 Gb/s NIC per GPU: 50e9)."""
    flops: float
    """Dense bf16 FLOP/s per GPU, peak (`parlab.costs.hardware`: H100 SXM 989.4e12)."""
    intra_name: str = "NVLink"
    """Name of the link inside a node, for tables and drawings."""
    inter_name: str = "InfiniBand"
    """Name of the link between nodes."""
    achievable: float = ACHIEVABLE
    """Share of `flops` a step's matmuls run at (see ACHIEVABLE): compute time is the model's
    FLOPs over achievable · flops, and the planner's MFU can be at most this."""

    def __post_init__(self) -> None:
        _whole("Cluster", "gpus", self.gpus)
        _whole("Cluster", "gpus_per_node", self.gpus_per_node)
        for name in ("memory", "intra_bw", "inter_bw", "flops", "achievable"):
            _positive("Cluster", name, getattr(self, name))
        if self.achievable > 1:
            raise ValueError(f"Cluster.achievable={self.achievable!r} is a share of the peak: "
                             f"pass {_HINTS['achievable']}")
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"Cluster.gpus={self.gpus} is not a whole number of nodes of "
                             f"{self.gpus_per_node}: use a multiple of gpus_per_node")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node


class Shape(NamedTuple):
    """Axis sizes in the mesh's order, outermost first."""

    dp: int
    """Data-parallel degree."""
    pp: int
    """Pipeline stages."""
    ep: int
    """Expert-parallel degree."""
    cp: int
    """Context-parallel degree."""
    tp: int
    """Tensor-parallel degree (innermost: consecutive ranks)."""


@dataclass(frozen=True)
class AxisTraffic:
    """What one parallel axis puts on the wire, per GPU and optimizer step."""

    axis: str
    """"tp", "cp", "ep", "pp" or "dp" (dp: the dense gradients' group, dp·ep·cp ranks)."""
    size: int
    """Ranks in one group of this axis."""
    nbytes: float
    """Bytes one GPU sends per optimizer step."""
    nodes: int
    """Most nodes one group spans (1: it stays inside a node)."""
    link: str
    """The link it rides, e.g. "NVLink" or "InfiniBand"."""
    bandwidth: float
    """That link's bytes/s per direction."""
    seconds: float
    """nbytes / bandwidth."""

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


@dataclass(frozen=True)
class Plan:
    """One candidate: its shape, memory, traffic, bubble, time, and whether it was kept."""

    dp: int
    """Data-parallel degree d (replicas of the dense layers: d·ep)."""
    tp: int
    """Tensor-parallel degree t (with sequence parallelism)."""
    pp: int
    """Pipeline stages p, run by `schedule`."""
    cp: int
    """Context-parallel degree c, by `cp_kind`."""
    ep: int
    """Expert-parallel degree e."""
    strategy: str
    """ddp, zero1, zero2 or zero3 over the data-parallel ranks."""
    recompute: str
    """Activation recomputation: none, selective or full."""
    micro_batch: int
    """Sequences per micro-batch, b."""
    microbatches: int
    """Micro-batches each pipeline runs per step, m = B / (d·e·b)."""
    memory: dict[str, float]
    """Bytes per GPU of the fullest stage (`stage`), by part: the state's parts, "activations"
    and "logits" (the loss's fp32 logits, on the stage that computes it)."""
    capacity: float
    """Bytes per GPU a plan may fill (usable share of the GPU's memory)."""
    traffic: tuple[AxisTraffic, ...]
    """Every axis of size > 1 (dp always), innermost first."""
    bubble: float
    """Pipeline bubble as a share of the step: (p-1)/(m+p-1) under 1F1B, (p-1)/(3m+p-1)
    under DualPipe-V (`parlab.plan.costs.bubble_seconds`)."""
    times: dict[str, float]
    """Seconds per step: compute, the exposed comms of each axis, bubble; they sum to step_s."""
    kept: bool
    """True when every check passed."""
    reasons: tuple[str, ...] = field(default=())
    """Why it was rejected (every failed check) or, when kept, what makes it work."""
    peak_compute_s: float = 0.0
    """Seconds the model's 6·N_act FLOPs per token of a step would take at peak FLOP/s."""
    cp_kind: str = "ring"
    """How CP splits attention: "ring" (ring attention) or "ulysses" (all-to-all by heads)."""
    schedule: str = "1f1b"
    """The pipeline schedule: "1f1b" or "dualpipe_v" (two chunks per rank in a V)."""
    precision: str = "bf16"
    """What the GEMMs run in: "bf16", or "fp8" (`parlab.costs.precision`)."""
    stage: str = "first"
    """Which stage `memory` is: "first", "last", "only" (p = 1) or "first and last"
    (DualPipe-V's rank 0); the fullest, by `parlab.plan.costs.fullest_stage`."""

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    @property
    def step_s(self) -> float:
        return sum(self.times.values())

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the step's 6N FLOPs per token at peak, over the step time
        (see the module docstring); at most the cluster's `achievable`."""
        return self.peak_compute_s / self.step_s if self.step_s else 0.0

    @property
    def label(self) -> str:
        names = {"cp": "CP" if self.cp_kind == "ring" else "Ulysses CP",
                 "pp": "PP" if self.schedule == "1f1b" else "DualPipe-V PP"}
        axes = [f"{names.get(a, a.upper())} {n}" for a, n in (("tp", self.tp), ("cp", self.cp),
                ("ep", self.ep), ("pp", self.pp), ("dp", self.dp)) if n > 1]
        fp8 = ", FP8" if self.precision == "fp8" else ""
        return (f"{' × '.join(axes) or '1 GPU'}, {self.strategy}, {self.recompute} recompute"
                + fp8)

    def axis(self, name: str) -> AxisTraffic | None:
        return next((a for a in self.traffic if a.axis == name), None)
