r"""Module 08's Llama in torchtitan's shape: the modules PyTorch's parallel API is applied to.

    model = TitanLlama(LlamaConfig())          # the weights of parlab.model.Llama(cfg)
    logits = model(x)                          # x (B, T) word ids -> (B, T, V)
    part = split_stage(model, stage=1, stages=[[0, 1], [2, 3]])   # pipeline stage 1 of 2

torchtitan's Llama (torchtitan/models/llama3/model/model.py) is laid out for its
`parallelize_llama` and its pipeline split, and this one follows it:

- the top level is `tok_embeddings`, `layers`, `norm`, `output`, each a module that may be
  None: a pipeline stage keeps the layers it runs and sets the others to None, and its
  `forward` skips what is None (stage 0 embeds word ids, a later stage takes the hidden
  states, the last applies the norm and the head);
- `layers` is an `nn.ModuleDict` keyed "0", "1", ...: a stage that deletes layers keeps the
  others' names, so a parameter is called the same on every grid (`layers.2.attention.wq`);
- every matrix is an `nn.Linear` called as a module (`self.w1(x)`), never through its weight:
  `parallelize_module`'s styles work through the module's forward hooks, which a bare
  `F.linear(x, self.w1.weight)` would skip (the course's `parlab.model.SwiGLU` does that);
- attention reads its head count from the projection (`view(B, T, -1, D)`), so TP's 1/t of
  the heads needs no change to the module.

Names (torchtitan's): a block is `attention_norm`, `attention.{wq, wk, wv, wo}`, `ffn_norm`,
`feed_forward.{w1, w2, w3}` with $W_2(\mathrm{silu}(W_1 x) \odot W_3 x)$: w1 is the course's
gate, w3 its up, w2 its down. `parlab.compose.titan.names` maps them onto the single-device
model's names, for one checkpoint format.

The head. The course's Llama ties it to the embedding (one matrix, two uses); torchtitan's
Llama 3 does not tie. Here `output` is an `nn.Linear` of its own that starts as a copy of the
embedding; a tied run keeps the two equal by adding their gradients after backward
(`parlab.compose.titan.train.sync_tied`), as Megatron does for the copies on the first and
last pipeline stage. MoE layers are not built here (`moe_layers` must be empty).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.model.llama import (
    Llama,
    LlamaBlock,
    LlamaConfig,
    RMSNorm,
    apply_rope,
    expand_kv,
    rope_angles,
)

__all__ = ["TitanAttention", "TitanFeedForward", "TitanBlock", "TitanLlama", "split_stage",
           "stage_layers"]


class TitanAttention(nn.Module):
    """Causal grouped-query attention: wq (HD, C), wk and wv (H_kv D, C), wo (C, HD)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        c, d = cfg.hidden, cfg.hidden // cfg.heads
        self.head_dim, self.groups, self.theta = d, cfg.heads // cfg.kv_heads, cfg.rope_theta
        self.wq = nn.Linear(c, cfg.heads * d, bias=False)
        self.wk = nn.Linear(c, cfg.kv_heads * d, bias=False)
        self.wv = nn.Linear(c, cfg.kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, c, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        B, T, _ = x.shape
        d = self.head_dim
        q = self.wq(x).view(B, T, -1, d).transpose(1, 2)  # (B, H', T, D): H' = H/t under TP
        k = self.wk(x).view(B, T, -1, d).transpose(1, 2)  # (B, H_kv', T, D)
        v = self.wv(x).view(B, T, -1, d).transpose(1, 2)
        cos, sin = rope_angles(torch.arange(T, device=x.device), d, theta=self.theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = expand_kv(k, self.groups), expand_kv(v, self.groups)  # (B, H', T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, C)


class TitanFeedForward(nn.Module):
    """SwiGLU: w1 and w3 (F, C), w2 (C, F); w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanBlock(nn.Module):
    """x + attention(attention_norm(x)), then + feed_forward(ffn_norm(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attention = TitanAttention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.feed_forward = TitanFeedForward(cfg.hidden, cfg.ffn)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def _copy_block(mine: TitanBlock, theirs: LlamaBlock) -> None:
    pairs: list[tuple[Any, Any]] = [
             (mine.attention_norm, theirs.attn_norm), (mine.ffn_norm, theirs.mlp_norm),
             (mine.attention.wq, theirs.attn.wq), (mine.attention.wk, theirs.attn.wk),
             (mine.attention.wv, theirs.attn.wv), (mine.attention.wo, theirs.attn.wo),
             (mine.feed_forward.w1, theirs.mlp.gate), (mine.feed_forward.w3, theirs.mlp.up),
             (mine.feed_forward.w2, theirs.mlp.down)]
    for a, b in pairs:
        a.weight.copy_(b.weight)


class TitanLlama(nn.Module):
    """tok_embeddings (V, C), layers "0".."L-1", norm, output (V, C): the weights of
    `parlab.model.Llama(cfg)`, the output a copy of the embedding when `cfg.tied`."""

    tok_embeddings: nn.Embedding | None
    norm: RMSNorm | None
    output: nn.Linear | None

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if cfg.moe_layers:
            raise ValueError(f"moe_layers={cfg.moe_layers}: the torchtitan-style Llama is "
                             "built dense only; use LlamaConfig(moe_layers=())")
        self.cfg = cfg
        with torch.device("meta"):  # shapes only: the weights are the single device's
            self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
            self.layers = nn.ModuleDict({str(i): TitanBlock(cfg) for i in range(cfg.layers)})
            self.norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
            self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.to_empty(device="cpu")
        single = Llama(cfg)  # seeded: the same numbers on every rank
        with torch.no_grad():
            self.tok_embeddings.weight.copy_(single.tok.weight)
            for i, block in enumerate(single.blocks):
                assert isinstance(block, LlamaBlock)
                _copy_block(self.layers[str(i)], block)  # type: ignore[arg-type]
            self.norm.weight.copy_(single.norm.weight)
            self.output.weight.copy_(single.head_weight())

    def forward(self, h: Tensor) -> Tensor:
        """Word ids (B, T) on the stage with the embedding, else hidden states (B, T', C);
        logits (B, T, V) on the stage with the head, else hidden states."""
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def stage_layers(part: TitanLlama) -> list[int]:
    """The layer indices a (split) model still holds, in order."""
    return [int(k) for k in part.layers.keys()]


def split_stage(model: TitanLlama, stage: int, stages: list[list[int]]) -> TitanLlama:
    """Pipeline stage `stage` of `len(stages)`, in place (torchtitan's pipeline_module_split):
    the layers of `stages[stage]` only, the embedding on the first stage only, the final norm
    and the head on the last only. Returns `model`."""
    if not 0 <= stage < len(stages):
        raise ValueError(f"stage {stage} of {len(stages)} stages")
    keep = {str(i) for i in stages[stage]}
    for name in [k for k in model.layers.keys() if k not in keep]:
        del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != len(stages) - 1:
        model.norm = None
        model.output = None
    return model
