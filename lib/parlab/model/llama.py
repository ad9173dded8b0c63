r"""A Llama-style tiny model: RMSNorm, rotary positions, SwiGLU, grouped-query attention, MoE.

    from parlab.model import Llama, LlamaConfig

    cfg = LlamaConfig()                     # 4 layers, hidden 32, 4 heads over 2 KV heads, seq 16
    model = Llama(cfg)                      # the same weights every time for the same cfg.seed
    logits = model(x)                       # x (B, T) word ids -> (B, T, vocab)
    loss = Llama.loss(logits, y)            # mean cross-entropy over the B*T next words
    moe = Llama(LlamaConfig(moe_layers=(1, 3)))   # layers 1 and 3 route to top-2 of 4 experts

This is the single-device reference of module 08: `parlab.compose` shards it over DP × PP ×
TP (+SP) × CP × EP and must reproduce its losses. The pieces, as in Llama (Touvron et al.
2023, arXiv:2302.13971) and its GQA (Ainslie et al. 2023, arXiv:2305.13245):

- RMSNorm: $x / \sqrt{\overline{x^2} + \epsilon} \cdot w$ (no mean, no bias).
- Rotary embeddings (Su et al., arXiv:2104.09864): the pair $(x_i, x_{i+D/2})$ of a query or
  key at position p is rotated by the angle $p\,\theta^{-2i/D}$, so $q_p \cdot k_{p'}$ depends on
  $p - p'$ only. The angle needs the token's *global* position: a CP rank passes its own.
- Grouped-query attention: H query heads share $H_{kv}$ key/value heads; query head h reads
  KV head $\lfloor h / (H/H_{kv}) \rfloor$ (`expand_kv` repeats each KV head H/H_kv times).
- SwiGLU MLP: $W_\text{down}(\mathrm{silu}(W_\text{gate} x) \odot W_\text{up} x)$, width F.
- MoE layers (`moe_layers`): module 06's top-k softmax router (gates not renormalised) over
  E SwiGLU experts. Capacity: each *sequence* is a group, $c = \lceil \phi T k / E \rceil$
  slots per expert, kept in module 06's order (`parlab.moe.keep_mask`). A sequence is the
  group because it is the same on one device and on every grid: a parallel run that shards
  the sequence (CP, SP) gathers the expert ids of the whole sequence to apply the same rule.
- Head: tied to the embedding (`tied=True`, the default) or a matrix of its own.

Parameters (tied): $VC + L(2C + C(H + 2H_{kv})D + HDC + 3CF) + C$, with $D = C/H$; an MoE
layer has $EC + 3ECF$ instead of $3CF$. Defaults: 57,632. No dropout and no biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.moe.layer import expert_capacity, keep_mask, route

__all__ = ["LlamaConfig", "Llama", "RMSNorm", "rope_angles", "apply_rope", "expand_kv",
           "Attention", "SwiGLU", "swiglu", "MoESwiGLU", "sequence_keep_mask", "LlamaBlock"]


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama and the seed of its weights."""

    vocab: int = 256
    """Word ids the model knows; at least the shipped corpus's 254 words."""
    layers: int = 4
    hidden: int = 32
    """Width C of every token's vector."""
    heads: int = 4
    """Query heads H; must divide hidden (head dim D = C/H)."""
    kv_heads: int = 2
    """Key/value heads H_kv; must divide heads. TP size t must divide both."""
    ffn: int = 96
    """SwiGLU width F (Llama's 8C/3 rounded up to a multiple of 32)."""
    seq: int = 16
    """Context length T the training runs use."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied: bool = True
    """Head weight = embedding weight (Megatron's default; untie with False)."""
    moe_layers: tuple[int, ...] = ()
    """Indices of the layers whose MLP is a mixture of experts."""
    experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = None
    """None: no capacity (nothing dropped); else slots per expert and sequence, see above."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden={self.hidden}, heads={self.heads}, kv_heads="
                             f"{self.kv_heads}: heads must divide hidden and kv_heads heads")
        if (self.hidden // self.heads) % 2:
            raise ValueError("rotary embeddings rotate pairs: hidden/heads must be even")
        if any(not 0 <= i < self.layers for i in self.moe_layers):
            raise ValueError(f"moe_layers={self.moe_layers} must be layer indices < {self.layers}")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim."""

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:  # (..., C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_angles(positions: Tensor, head_dim: int, *, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of p * theta^(-2i/D) for each position p and pair i: both (T, D/2)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, device=positions.device,
                                  dtype=torch.float32) / head_dim)  # (D/2,)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_i, x_{i+D/2}) of x (B, H, T, D) by its angle; cos, sin (T, D/2)."""
    x1, x2 = x.chunk(2, dim=-1)  # 2 x (B, H, T, D/2)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, H, T, D)


def expand_kv(x: Tensor, groups: int) -> Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * groups, T, D): KV head j serves query heads j*g..j*g+g-1."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings: wq (HD, C), wk and wv (H_kv D,
    C), wo (C, HD), no biases. Query heads are rows h*D..(h+1)*D of wq (heads in order)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        c, d = cfg.hidden, cfg.hidden // cfg.heads
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, d
        self.theta = cfg.rope_theta
        self.wq = nn.Linear(c, cfg.heads * d, bias=False)
        self.wk = nn.Linear(c, cfg.kv_heads * d, bias=False)
        self.wv = nn.Linear(c, cfg.kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, c, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C), positions 0..T-1
        B, T, _ = x.shape
        d = self.head_dim
        q = self.wq(x).view(B, T, self.heads, d).transpose(1, 2)  # (B, H, T, D)
        k = self.wk(x).view(B, T, self.kv_heads, d).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.wv(x).view(B, T, self.kv_heads, d).transpose(1, 2)
        cos, sin = rope_angles(torch.arange(T, device=x.device), d, theta=self.theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = self.heads // self.kv_heads
        y = F.scaled_dot_product_attention(q, expand_kv(k, g), expand_kv(v, g), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.heads * d))  # (B, T, C)


def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """W_down(silu(W_gate x) * W_up x): (..., C) with (F, C), (F, C), (C, F) -> (..., C)."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


class SwiGLU(nn.Module):
    """The dense MLP: gate and up (F, C), down (C, F)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        return swiglu(x, self.gate.weight, self.up.weight, self.down.weight)


def sequence_keep_mask(experts: Tensor, *, num_experts: int,
                       capacity_factor: float | None) -> Tensor:
    """(B, T, k) bool from the expert ids (B, T, k): module 06's keep rule, one sequence per
    group, c = expert_capacity(T, ...); all True without a capacity factor."""
    if capacity_factor is None:
        return torch.ones_like(experts, dtype=torch.bool)
    _, T, k = experts.shape
    cap = expert_capacity(T, num_experts=num_experts, k=k, capacity_factor=capacity_factor)
    return torch.stack([keep_mask(seq, num_experts=num_experts, capacity=cap)
                        for seq in experts])  # (B, T, k)


class MoESwiGLU(nn.Module):
    """Router (E, C) and E SwiGLU experts: gate, up (E, F, C), down (E, C, F)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        e, c, f = cfg.experts, cfg.hidden, cfg.ffn
        self.num_experts, self.k, self.capacity_factor = e, cfg.top_k, cfg.capacity_factor
        self.router = nn.Parameter(torch.randn(e, c) * c ** -0.5)  # logits of order 1
        self.gate = nn.Parameter(torch.randn(e, f, c) * 0.02)
        self.up = nn.Parameter(torch.randn(e, f, c) * 0.02)
        self.down = nn.Parameter(torch.randn(e, c, f) * 0.02)

    def expert(self, e: int, h: Tensor) -> Tensor:
        """Expert e on rows h: (n, C) -> (n, C)."""
        return swiglu(h, self.gate[e], self.up[e], self.down[e])

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> sum_j keep * gate * expert(x)
        B, T, C = x.shape
        flat = x.reshape(-1, C)  # (N, C), N = B*T
        gates, experts, _ = route(flat, self.router, k=self.k)  # (N, k), (N, k)
        keep = sequence_keep_mask(experts.view(B, T, -1), num_experts=self.num_experts,
                                  capacity_factor=self.capacity_factor).view(-1, self.k)
        out = torch.zeros_like(flat)
        for e in range(self.num_experts):
            token, choice = ((experts == e) & keep).nonzero(as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, gates[token, choice, None] *
                                    self.expert(e, flat[token]))
        return out.view(B, T, C)


class LlamaBlock(nn.Module):
    """x + attn(attn_norm(x)), then + mlp(mlp_norm(x)); the MLP is dense or a MoE."""

    def __init__(self, cfg: LlamaConfig, *, moe: bool = False) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp: nn.Module = MoESwiGLU(cfg) if moe else SwiGLU(cfg.hidden, cfg.ffn)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Embedding (V, C), the blocks, a final RMSNorm, the head (tied or (V, C))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # seed the weights, leave the caller's RNG be
            torch.manual_seed(cfg.seed)
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.blocks = nn.ModuleList(LlamaBlock(cfg, moe=i in cfg.moe_layers)
                                        for i in range(cfg.layers))
            self.norm = RMSNorm(cfg.hidden, eps=cfg.norm_eps)
            self.head = None if cfg.tied else nn.Linear(cfg.hidden, cfg.vocab, bias=False)
            for m in self.modules():  # the MoE layers drew their own (decisive router)
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)

    def head_weight(self) -> Tensor:
        """(V, C): the embedding when tied, else the head's own matrix."""
        return self.tok.weight if self.head is None else self.head.weight

    def forward(self, idx: Tensor) -> Tensor:  # idx (B, T) word ids
        if idx.shape[1] > self.cfg.seq:
            raise ValueError(f"the input has {idx.shape[1]} positions, cfg.seq={self.cfg.seq}")
        x = self.tok(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm(x), self.head_weight())  # (B, T, V)

    @staticmethod
    def loss(logits: Tensor, y: Tensor) -> Tensor:
        """Mean cross-entropy of logits (B, T, V) against the next words y (B, T)."""
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())
