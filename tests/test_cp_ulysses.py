"""parlab.cp.ulysses: Ulysses attention on real ranks against PyTorch's own attention.

References computed here, independently of parlab's attention code:
- outputs and gradients: torch.nn.functional.scaled_dot_product_attention on the whole
  sequence in float64 (is_causal for the causal cases; grouped-query heads by
  repeat_interleave), differentiated by autograd; rank r's share is the rows of its
  positions. float64 blocks change only the summation order: rtol 1e-10.
- bytes: each all-to-all sends (c - 1)/c of a rank's tensor of b n H D elements, so the
  forward's four (q, k, v, out; k and v with H_kv heads) send (c - 1)/c b n (2H + 2H_kv) D
  elements of 8 bytes, and the backward the same again; derived here, then compared with the
  tracer (parlab.comm) and with parlab.costs.ulysses_bytes_per_layer.
- the cap: c not dividing the heads is refused before any exchange.
- ring against Ulysses (parlab.cp.compare): bytes and exposed time from the closed forms in
  this docstring's terms, at sizes where each one wins.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from parlab import comm, costs, cp, launch
from parlab.cp.layout import position_table

pytestmark = pytest.mark.usefixtures("no_orphans")
B, D, N = 2, 4, 6  # batch, head size, tokens per rank (even for zigzag, not a power of two)


def _inputs(world: int, heads: int, kv_heads: int, seed: int = 7):
    gen = torch.Generator().manual_seed(seed)
    t = world * N
    q = torch.randn(B, heads, t, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, t, D, generator=gen, dtype=torch.float64) for _ in "kv")
    dout = torch.randn(B, heads, t, D, generator=gen, dtype=torch.float64)
    return q, k, v, dout


def _reference(q, k, v, dout, causal):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                         is_causal=causal)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _worker(heads, kv_heads, causal, layout):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = _inputs(world, heads, kv_heads)
    pos = position_table(layout, world, world * N)
    mine = [x[..., pos[rank], :].clone().requires_grad_() for x in (q, k, v)]
    with comm.trace() as fwd:
        out = cp.ulysses_attention(*mine, pos, causal=causal)
    with comm.trace() as bwd:
        out.backward(dout[..., pos[rank], :])
    kinds = {e.kind for e in fwd.events + bwd.events}
    return {"out": out.detach(), "grads": [x.grad for x in mine], "pos": pos[rank],
            "fwd": fwd.wire_bytes(), "bwd": bwd.wire_bytes(), "kinds": kinds,
            "calls": (fwd.count(), bwd.count())}


CASES = [(2, 4, 4, False, "contiguous"), (2, 4, 2, True, "contiguous"),
         (4, 8, 8, True, "contiguous"), (4, 12, 4, True, "zigzag"), (3, 6, 3, True, "striped"),
         (4, 8, 4, False, "striped")]


@pytest.mark.parametrize("world, heads, kv_heads, causal, layout", CASES)
def test_ulysses_equals_full_attention(world, heads, kv_heads, causal, layout):
    results = launch.run(_worker, world, heads, kv_heads, causal, layout)
    q, k, v, dout = _inputs(world, heads, kv_heads)
    want = _reference(q, k, v, dout, causal)
    for res in results:
        rows = res["pos"]
        torch.testing.assert_close(res["out"], want[0][..., rows, :], rtol=1e-10, atol=1e-12)
        for got, full in zip(res["grads"], want[1:], strict=True):
            torch.testing.assert_close(got, full[..., rows, :], rtol=1e-10, atol=1e-12)
        elems = (world - 1) / world * B * N * (2 * heads + 2 * kv_heads) * D
        assert res["fwd"] == pytest.approx(8 * elems) and res["bwd"] == pytest.approx(8 * elems)
        assert res["kinds"] == {"all_to_all_single"} and res["calls"] == (4, 4)
        assert costs.ulysses_bytes_per_layer(B, world * N, heads * D, world, 8,
                                             h_kv=kv_heads * D) == pytest.approx(res["fwd"])
        assert costs.ulysses_bytes_per_layer(B, world * N, heads * D, world, 8,
                                             h_kv=kv_heads * D, backward=True) == \
            pytest.approx(res["fwd"] + res["bwd"])


def _reshuffle_worker():
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(1 * 8 * world * 3 * 2, dtype=torch.float64).reshape(1, 8, world * 3, 2)
    mine = x[..., rank * 3:(rank + 1) * 3, :].contiguous()
    heads = cp.seq_to_heads(mine)
    return heads, cp.heads_to_seq(heads), x


@pytest.mark.parametrize("world", [2, 4])
def test_the_two_reshuffles_by_hand(world):
    # rank r holds tokens 3r..3r+2 of all 8 heads; after seq_to_heads it holds every token of
    # heads r*8/c .. (r+1)*8/c - 1; heads_to_seq undoes it
    for r, (heads, back, x) in enumerate(launch.run(_reshuffle_worker, world)):
        hc = 8 // world
        assert torch.equal(heads, x[:, r * hc:(r + 1) * hc])
        assert torch.equal(back, x[..., r * 3:(r + 1) * 3, :])


def _cap_worker():
    q = torch.zeros(1, 6, 2, 4)
    try:
        cp.ulysses_attention(q, q, q, torch.arange(8).reshape(4, 2), causal=False)
    except ValueError as err:
        return str(err)
    return "no error"


def test_heads_not_divisible_by_the_degree_are_refused():
    for msg in launch.run(_cap_worker, 4):
        assert "6 query heads, not a multiple of 4" in msg and "head count" in msg
    with pytest.raises(ValueError, match="key/value heads"):
        cp.check_heads(8, 4, kv_heads=2)
    cp.check_heads(8, 4, kv_heads=4)


def test_ring_against_ulysses_in_closed_form():
    # MHA, c = 8, per-rank block n = s/8, bf16, H = 64 heads of 128 on an H100-like 1e15
    # FLOP/s. Ring forward: 7 steps of K, V = 2 b n h d bytes; Ulysses 4 * 7/8 * b n h d
    h, c, d, fl = 64 * 128, 8, 2, 1e15
    for s in (8192, 262144):
        for bw in (450e9, 50e9):
            got = cp.attention_comm(b=1, s=s, heads=64, head_dim=128, c=c, flops=fl,
                                    bandwidth=bw)
            n = s / c
            assert got["ring_bytes"] == pytest.approx(7 * 2 * n * h * d)
            assert got["ulysses_bytes"] == pytest.approx(4 * 7 / 8 * n * h * d)
            block = 4 * n * n * h * 0.5 / fl  # causal: half the block on average
            xfer = 2 * n * h * d / bw
            assert got["ring_exposed_s"] == pytest.approx(7 * max(0.0, xfer - block))
            assert got["ulysses_exposed_s"] == pytest.approx(4 * 7 / 8 * n * h * d / bw)
    # short sequence, NVLink: the ring's 1024-token blocks cannot hide (Ulysses cheaper);
    # long sequence: the ring hides entirely; grouped-query K/V (8 heads) hide it 8x sooner
    short = cp.attention_comm(b=1, s=8192, heads=64, head_dim=128, c=8, flops=fl, bandwidth=450e9)
    long = cp.attention_comm(b=1, s=262144, heads=64, head_dim=128, c=8, flops=fl,
                             bandwidth=450e9)
    gqa = cp.attention_comm(b=1, s=8192, heads=64, head_dim=128, c=8, flops=fl, bandwidth=450e9,
                            kv_heads=8)
    assert short["cheaper"] == "ulysses" and long["cheaper"] == "ring"
    assert long["ring_exposed_s"] == 0 and gqa["ring_exposed_s"] == 0
    threshold = fl * d / (2 * 450e9 * 0.5)  # n >= F d / (2 beta sigma)
    assert 1024 < threshold < 32768
    capped = cp.attention_comm(b=1, s=8192, heads=64, head_dim=128, c=16, flops=fl,
                               bandwidth=450e9, kv_heads=8)
    assert not capped["ulysses_allowed"] and capped["cheaper"] == "ring"
    assert math.isclose(cp.ring_bytes_per_layer(1, 16, 4, 1), 0.0)


def test_ring_against_ulysses_figure():
    # drawn from parlab.cp.attention_comm, whose closed forms the test above checks; here:
    # the figure is labelled, one panel per link, and the numbers it draws are those
    import matplotlib

    from parlab.widgets import cp as widgets_cp

    matplotlib.use("Agg")
    fig = widgets_cp.plot_ring_vs_ulysses(heads=64, head_dim=128, world_size=8, kv_heads=8,
                                          seqs=[8192, 65536])
    assert len(fig.axes) == 2 and "NVLink" in fig.axes[0].get_title()
    assert "exposed" in fig.axes[0].get_ylabel() and "sequence length" in fig.axes[1].get_xlabel()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["ring (MHA)", "Ulysses (MHA)", "ring (GQA, 8 K/V heads)",
                      "Ulysses (GQA, 8 K/V heads)"]
    got = widgets_cp.ring_vs_ulysses([8192], heads=64, head_dim=128, world_size=8,
                                     bandwidth=450e9)
    line = fig.axes[0].get_lines()[1]  # Ulysses, MHA, NVLink
    assert line.get_ydata()[0] == got["ulysses"][0] * 1e3
