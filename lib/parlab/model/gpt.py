r"""A tiny GPT for the capstone: embeddings, parlab's transformer `Block`s, a language-model head.

    from parlab.model import GPT, GPTConfig

    cfg = GPTConfig()                  # 2 layers, hidden 32, 4 heads, 256 words, 32 positions
    model = GPT(cfg)                   # the same weights every time for the same cfg.seed
    logits = model(x)                  # x (B, T) word ids -> (B, T, vocab)
    loss = model.loss(logits, y)       # mean cross-entropy over the B*T next words

The layers are `parlab.model.Block` (pre-LayerNorm attention and MLP, causal), so
`TPBlock.from_block` gives their tensor-parallel copies with the same weights and the rest of
the model stays replicated (`parlab.capstone.shard_model`). Parameters:
$V h + s h + L(12h^2 + 13h) + 2h + hV$ (embeddings, L blocks, final LayerNorm, head): 42,880
for the defaults. No dropout, so a forward pass is a pure function of weights and input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.model.transformer import Block

__all__ = ["GPTConfig", "GPT"]


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT and the seed of its weights."""

    vocab: int = 256
    """Number of word ids the model knows; at least the corpus vocabulary (254 words)."""
    layers: int = 2
    """Number of transformer blocks."""
    hidden: int = 32
    """Width h of every token's vector; the MLP inside a block is 4h wide."""
    heads: int = 4
    """Attention heads per block; must divide hidden, and TP size t must divide heads."""
    seq: int = 32
    """Longest input (context length): the number of learned position embeddings."""
    seed: int = 0
    """Seed of the initial weights: the same seed gives the same model in every process."""


class GPT(nn.Module):
    """Decoder-only language model: token + position embedding, blocks, LayerNorm, head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"hidden={cfg.hidden} is not divisible by heads={cfg.heads}: "
                             "every head gets hidden/heads features; change one of them")
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # seed the weights, leave the caller's RNG be
            torch.manual_seed(cfg.seed)
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)  # (V, h)
            self.pos = nn.Embedding(cfg.seq, cfg.hidden)  # (S, h)
            nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's scale, not N(0, 1)
            nn.init.normal_(self.pos.weight, std=0.02)
            self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads, causal=True)
                                        for _ in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)  # weight (V, h)

    def forward(self, idx: Tensor) -> Tensor:  # idx: (B, T) word ids
        T = idx.shape[1]
        if T > self.cfg.seq:
            raise ValueError(f"the input has {T} positions but the model has {self.cfg.seq} "
                             "position embeddings: use a shorter input or a larger cfg.seq")
        positions = torch.arange(T, device=idx.device)  # (T,)
        x = self.tok(idx) + self.pos(positions)  # (B, T, h)
        for block in self.blocks:
            x = block(x)  # (B, T, h)
        return self.head(self.ln_f(x))  # (B, T, V)

    @staticmethod
    def loss(logits: Tensor, y: Tensor) -> Tensor:
        """Mean cross-entropy of logits (B, T, V) against the next words y (B, T): a scalar."""
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())  # (B*T, V) vs (B*T,)
