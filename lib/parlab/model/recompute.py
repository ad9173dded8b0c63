r"""Activation recomputation: keep less for backward, compute it again when backward needs it.

    layer = RecomputeLayer(hidden=64, n_heads=4, p_drop=0.1, recompute="selective")
    y = layer(x)                      # x: (B, T, C)
    saved_activation_bytes(layer, x)  # what autograd keeps for backward, measured

The layer is a GPT layer as Korthikanti et al. count it ("Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198): pre-LayerNorm attention with Megatron's unfused
core (scores $QK^\top/\sqrt{d}$, softmax, dropout on the probabilities, times V), an output
projection, a 4h GeLU MLP, and a dropout before each residual addition. With 2-byte
activations and 1-byte dropout masks it keeps, per layer,

| recompute   | bytes kept for backward      | extra forward work                     |
|-------------|------------------------------|----------------------------------------|
| "none"      | $sbh(34 + 5as/h)$            | none                                   |
| "selective" | $34\,sbh$                    | the scores again: $2bs^2h$ FLOPs          |
| "full"      | $2\,sbh$ (the layer's input) | the whole forward again: $24bsh^2 + 4bs^2h$ |

Selective recomputation checkpoints only the attention core: the $5as^2b$ of scores, mask and
dropout output grows with $s^2$ and dominates at long sequences, yet costs little to redo.
PyTorch's non-reentrant checkpoint stops recomputing as soon as the tensors backward needs are
back: the core's last GEMM (times V) only needs the dropout output, so only the scores GEMM is
redone, $2bs^2h$; Megatron's reentrant version reruns the whole core, $4bs^2h$. Full
recomputation keeps only each layer's input and reruns the layer: backward then costs a
whole extra forward, +1/3 of a training step (forward 1, backward 2). `costs.activations`
has the closed forms; `layer_flops` the FLOPs.

Measured with `parlab.costs.activations.SavedTensorMeter`, the table holds to the byte plus
the LayerNorms' statistics (a mean and a reciprocal standard deviation per token for each of
the two: $8sb$ bytes in bf16), which the paper leaves out as small.

Both use `torch.utils.checkpoint` (non-reentrant), which also replays the RNG state, so the
recomputed dropout masks are the masks of the first forward: the gradients are unchanged.
Dropout draws from torch's default generator for that reason (seed it with torch.manual_seed).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from parlab.costs.activations import SavedTensorMeter

__all__ = ["Recompute", "POLICIES", "RecomputeLayer", "attention_core", "dropout",
           "saved_activation_bytes", "layer_flops", "recompute_flops"]

Recompute = Literal["none", "selective", "full"]
POLICIES: tuple[Recompute, ...] = ("none", "selective", "full")


def dropout(x: Tensor, p_drop: float, training: bool = True) -> Tensor:
    """x * mask / (1 - p_drop) with a bool mask (1 byte per element kept for backward)."""
    if not training or p_drop == 0.0:
        return x
    keep = torch.rand(x.shape, device=x.device) >= p_drop  # bool: what autograd saves
    return x * keep / (1.0 - p_drop)


def attention_core(q: Tensor, k: Tensor, v: Tensor, p_drop: float, training: bool) -> Tensor:
    """Megatron's unfused core: softmax(QK^T / sqrt(d)) with dropout, times V.

    q, k, v: (B, a, s, d), contiguous; returns (B, a, s, d). Keeps for backward: q and k
    (for the scores), the softmax output, the dropout mask, the dropout output and v."""
    s = q.shape[-2]
    future = torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + future  # (B, a, s, s), causal
    probs = scores.softmax(dim=-1)  # (B, a, s, s)
    return dropout(probs, p_drop, training) @ v  # (B, a, s, d)


class RecomputeLayer(nn.Module):
    """One GPT layer whose activations are kept, selectively recomputed, or fully recomputed."""

    def __init__(self, hidden: int, n_heads: int, *, p_drop: float = 0.1,
                 recompute: Recompute = "none") -> None:
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden = {hidden} must be a multiple of n_heads = {n_heads}")
        if recompute not in POLICIES:
            raise ValueError(f"recompute must be one of {POLICIES}, got {recompute!r}")
        self.n_heads, self.p_drop, self.recompute = n_heads, p_drop, recompute
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)  # weight (3C, C)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def _attention(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        d = C // self.n_heads
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.n_heads, d).permute(2, 0, 3, 1, 4)
        q, k, v = (z.contiguous() for z in qkv)  # 3 x (B, a, T, d)
        if self.recompute == "selective":
            y = checkpoint(attention_core, q, k, v, self.p_drop, self.training,
                           use_reentrant=False)
        else:
            y = attention_core(q, k, v, self.p_drop, self.training)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): a copy, the proj input
        return dropout(self.proj(y), self.p_drop, self.training)

    def _layer(self, x: Tensor) -> Tensor:  # (B, T, C)
        x = x + self._attention(x)
        h = self.fc2(F.gelu(self.fc1(self.ln2(x))))  # (B, T, C) through (B, T, 4C)
        return x + dropout(h, self.p_drop, self.training)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        if self.recompute == "full":
            return checkpoint(self._layer, x, use_reentrant=False)
        return self._layer(x)


def saved_activation_bytes(layer: nn.Module, x: Tensor) -> int:
    """Bytes autograd keeps for backward after `layer(x)`, parameters not counted (state)."""
    with SavedTensorMeter(exclude=tuple(layer.parameters())) as meter:
        layer(x)
    return meter.total


def layer_flops(b: int, s: int, h: int) -> int:
    r"""Matmul FLOPs of one forward of the layer: $24bsh^2 + 4bs^2h$ (2 per multiply-add:
    QKV $6bsh^2$, scores $2bs^2h$, times V $2bs^2h$, projection $2bsh^2$, MLP $16bsh^2$)."""
    return 24 * b * s * h * h + 4 * b * s * s * h


def recompute_flops(b: int, s: int, h: int, recompute: Recompute) -> int:
    """Extra forward FLOPs a training step pays for recomputing one layer."""
    return {"none": 0, "selective": 2 * b * s * s * h, "full": layer_flops(b, s, h)}[recompute]
