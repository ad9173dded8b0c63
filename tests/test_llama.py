"""parlab.model.llama against independent references: PyTorch's RMSNorm, attention written
out head by head, the rotation property of RoPE, module 06's token-loop MoE, closed forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from parlab.model import (
    Llama,
    LlamaConfig,
    MoESwiGLU,
    RMSNorm,
    apply_rope,
    expand_kv,
    load_corpus,
    rope_angles,
)
from parlab.moe import moe_reference

CFG = LlamaConfig()
MOE = LlamaConfig(moe_layers=(1, 3), capacity_factor=1.0)


def test_rmsnorm_is_torchs():
    x = torch.randn(3, 5, 32)
    ours = RMSNorm(32, eps=1e-5)
    theirs = torch.nn.RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.rand(32) + 0.5)
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), theirs(x))


def test_rope_keeps_lengths_and_sees_only_the_distance():
    d = 8
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)

    def at(x, p):
        cos, sin = rope_angles(torch.tensor([p]), d, theta=10000.0)
        return apply_rope(x, cos, sin)

    torch.testing.assert_close(at(q, 0), q)  # position 0: no rotation
    torch.testing.assert_close(at(q, 7).norm(), q.norm())  # a rotation keeps the length
    dots = [float((at(q, p + 3) * at(k, p)).sum()) for p in (0, 5, 11)]  # distance 3
    assert max(dots) - min(dots) < 1e-5, dots
    assert abs(float((at(q, 4) * at(k, 0)).sum()) - dots[0]) > 1e-3  # another distance


def _attention_by_hand(attn, x: torch.Tensor) -> torch.Tensor:
    """Each query head against its KV head, softmax written out, causal by a mask."""
    B, T, _ = x.shape
    d, g = attn.head_dim, attn.heads // attn.kv_heads
    cos, sin = rope_angles(torch.arange(T), d, theta=attn.theta)
    heads = []
    for h in range(attn.heads):
        j = h // g  # the KV head query head h reads
        q = F.linear(x, attn.wq.weight[h * d:(h + 1) * d])[:, None]  # (B, 1, T, D)
        k = F.linear(x, attn.wk.weight[j * d:(j + 1) * d])[:, None]
        v = F.linear(x, attn.wv.weight[j * d:(j + 1) * d])
        q, k = apply_rope(q, cos, sin)[:, 0], apply_rope(k, cos, sin)[:, 0]  # (B, T, D)
        s = q @ k.transpose(1, 2) / math.sqrt(d)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v)  # (B, T, D)
    return attn.wo(torch.cat(heads, dim=-1))


def test_grouped_query_attention_is_each_head_against_its_kv_head():
    model = Llama(CFG)
    attn = model.blocks[0].attn
    x = torch.randn(2, CFG.seq, CFG.hidden)
    torch.testing.assert_close(attn(x), _attention_by_hand(attn, x), atol=1e-6, rtol=1e-5)
    kv = torch.arange(2.0).view(1, 2, 1, 1)
    assert expand_kv(kv, 2).flatten().tolist() == [0, 0, 1, 1]  # head h reads KV head h // g


def test_swiglu_is_silu_gate_times_up_then_down():
    mlp = Llama(CFG).blocks[0].mlp
    x = torch.randn(4, CFG.hidden)
    gate, up = x @ mlp.gate.weight.t(), x @ mlp.up.weight.t()
    expected = (gate * torch.sigmoid(gate) * up) @ mlp.down.weight.t()
    torch.testing.assert_close(mlp(x), expected)


@pytest.mark.parametrize("capacity_factor", [None, 1.0, 0.5])
def test_moe_is_module_06s_token_loop_with_one_group_per_sequence(capacity_factor):
    cfg = LlamaConfig(moe_layers=(0,), capacity_factor=capacity_factor)
    moe = MoESwiGLU(cfg)
    x = torch.randn(3, 8, cfg.hidden)
    flat = x.reshape(-1, cfg.hidden)
    from parlab.moe import route

    gates, experts, _ = route(flat, moe.router, k=cfg.top_k)
    loop = moe_reference(flat, gates, experts, moe.expert, num_experts=cfg.experts,
                         capacity_factor=capacity_factor, groups=3) - flat  # no residual
    torch.testing.assert_close(moe(x).reshape(-1, cfg.hidden), loop, atol=1e-6, rtol=1e-5)
    if capacity_factor == 0.5:  # the capacity binds: some assignments were dropped
        assert (moe(x) - moe_reference(flat, gates, experts, moe.expert, num_experts=4)
                .sub(flat).view_as(x)).abs().max() > 1e-4


def test_parameter_count_is_the_closed_form():
    c, h, kv, f, v, n = CFG.hidden, CFG.heads, CFG.kv_heads, CFG.ffn, CFG.vocab, CFG.layers
    d = c // h
    per_layer = 2 * c + c * (h + 2 * kv) * d + h * d * c + 3 * c * f
    tied = v * c + n * per_layer + c
    assert sum(p.numel() for p in Llama(CFG).parameters()) == tied == 57_632
    untied = Llama(LlamaConfig(tied=False))
    assert sum(p.numel() for p in untied.parameters()) == tied + v * c
    moe_layer = c * CFG.experts + 3 * CFG.experts * c * f
    assert sum(p.numel() for p in Llama(MOE).parameters()) == tied + 2 * (moe_layer - 3 * c * f)


def test_seeded_tied_and_causal():
    a, b = Llama(CFG), Llama(CFG)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert a.head_weight() is a.tok.weight
    x = torch.randint(0, CFG.vocab, (2, CFG.seq))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % CFG.vocab  # change the future only
    with torch.no_grad():
        torch.testing.assert_close(a(x)[:, :10], a(y)[:, :10])
        assert (a(x)[:, 10:] - a(y)[:, 10:]).abs().max() > 1e-4


def test_the_vocabulary_fits_and_bad_shapes_say_so():
    assert CFG.vocab >= len(load_corpus()[1])
    with pytest.raises(ValueError, match="kv_heads"):
        LlamaConfig(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="moe_layers"):
        LlamaConfig(moe_layers=(7,))


@pytest.mark.parametrize("cfg", [CFG, MOE], ids=["dense", "moe"])
def test_a_few_steps_learn(cfg):
    from parlab.compose import train_single

    losses = train_single(cfg, 12, global_batch_size=8, lr=3e-3)
    assert losses[0] > math.log(CFG.vocab) - 0.1  # starts near uniform over 256 words
    assert losses[-1] < losses[0] - 0.5, losses
