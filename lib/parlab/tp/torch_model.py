r"""The course's layer laid out the way PyTorch's tensor-parallel API expects it.

PyTorch's `ColwiseParallel` shards a Linear's weight by contiguous blocks of rows, `Shard(0)`.
The course's `Attention` keeps Q, K and V in one fused Linear whose rows are [Q; K; V], so a
contiguous block of rows is not one rank's heads (module 02, section 8): rank 0 of 2 would get
all of Q and half of K. torchtitan's Llama keeps three Linears, `wq`, `wk`, `wv`, whose
contiguous row blocks ARE whole heads. `SplitAttention.from_attention` cuts the course's fused
weight into those three, so the same weights run under either API:

    q = x W_q^T + b_q,  k = x W_k^T + b_k,  v = x W_v^T + b_v   (W_q: rows 0..C-1 of qkv, ...)
    y = proj(attention_heads(q, k, v, n_heads))

`attention_heads` reads the head width from the tensors: d = q.shape[-1] / n_heads. Under
`ColwiseParallel` (plain-tensor output, `use_local_output=True`) q holds this rank's C/t
features, so `n_heads` must be the heads this rank holds, n/t; left at n, every head is t
times too narrow and attention mixes the wrong features (no error when C/t is a multiple of
n). With `use_local_output=False` q stays a DTensor of the global shape and `n_heads` stays n.

- `SplitAttention`, `SplitBlock` (ln1, attn, ln2, mlp as `parlab.model.Block`), `SplitLM`
  (embedding `tok`, `blocks`, `ln_f`, `head` without bias: a tiny decoder for the loss), each
  `from_...` the course's single-device module with the same weights.
- `make_lm(vocab, hidden, heads, layers, seed)`: the course's pieces, every parameter random:
  (`Block`s with fused qkv, the embedding, the final LayerNorm and the head) and its split copy.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.model.transformer import MLP, Attention, Block, attention_heads

__all__ = ["SplitAttention", "SplitBlock", "SplitLM", "FusedLM", "make_lm"]


def _rows(linear: nn.Linear, start: int, end: int) -> nn.Linear:
    """A new Linear holding rows [start, end) of `linear` (weight and bias), copied."""
    out = nn.Linear(linear.in_features, end - start, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[start:end])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[start:end])
    return out


class SplitAttention(nn.Module):
    """The course's Attention with q, k, v as three Linears (torchtitan's wq, wk, wv)."""

    def __init__(self, hidden: int, n_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))  # (C, C) each
        self.proj = nn.Linear(hidden, hidden)

    @classmethod
    def from_attention(cls, attn: Attention) -> SplitAttention:
        """The same weights: rows [0, C), [C, 2C), [2C, 3C) of the fused qkv, proj copied."""
        C = attn.qkv.in_features
        out = cls(C, attn.n_heads, causal=attn.causal)
        out.q, out.k, out.v = (_rows(attn.qkv, j * C, (j + 1) * C) for j in range(3))
        out.proj = copy.deepcopy(attn.proj)
        return out

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, C) each; (B, T, C/t) under TP
        return self.proj(attention_heads(q, k, v, self.n_heads, causal=self.causal))


class SplitBlock(nn.Module):
    """`parlab.model.Block` with a SplitAttention: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, hidden: int, n_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = SplitAttention(hidden, n_heads, causal=causal)
        self.mlp = MLP(hidden)

    @classmethod
    def from_block(cls, block: Block) -> SplitBlock:
        out = cls(block.ln1.normalized_shape[0], block.attn.n_heads, causal=block.attn.causal)
        out.ln1, out.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        out.attn = SplitAttention.from_attention(block.attn)
        out.mlp = copy.deepcopy(block.mlp)
        return out

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class FusedLM(nn.Module):
    """One device, the course's pieces: tok (V, C), Blocks with fused qkv, ln_f, head (V, C)
    without bias. ids (B, T) -> logits (B, T, V). No position embedding: the causal mask is
    the only thing that tells positions apart, which is all a test of the layout needs."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:  # (B, T) -> (B, T, V)
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class SplitLM(FusedLM):
    """FusedLM with every Block a SplitBlock: what `parallelize_module` is given."""

    @classmethod
    def from_lm(cls, lm: FusedLM) -> SplitLM:
        out = copy.deepcopy(lm)
        out.__class__ = cls
        out.blocks = nn.ModuleList(SplitBlock.from_block(b) for b in lm.blocks)  # type: ignore
        assert isinstance(out, SplitLM)
        return out


def make_lm(vocab: int, hidden: int, heads: int, layers: int, *, seed: int,
            device: torch.device | str = "cpu") -> tuple[FusedLM, SplitLM]:
    """(FusedLM, SplitLM) with the same weights, every parameter random and seeded (LayerNorms
    included, so a layer left at its default cannot match by accident)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = FusedLM(vocab, hidden, heads, layers)
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    lm = lm.to(device)
    return lm, SplitLM.from_lm(lm)


def lm_loss(logits: Tensor, target: Tensor) -> Tensor:
    """The mean cross-entropy over the B T tokens, as F.cross_entropy computes it."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
