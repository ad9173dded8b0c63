"""parlab.cp.allgather: Llama 3's all-gather context parallelism on real ranks, against PyTorch's
own attention on one device with the same document-and-causal mask.

References computed here, independently of parlab's attention and mask code:
- the mask: built by loops over documents and positions (query p sees key j when both lie in
  the same document and j <= p), the documents cut at chosen lengths that cross the zigzag
  chunk boundaries (chunks of 3 tokens), and a sequence of one document;
- outputs and gradients: torch.nn.functional.scaled_dot_product_attention on the whole
  sequence in float64 with that boolean mask (grouped-query heads by repeat_interleave),
  differentiated by autograd; rank r's share is the rows of its zigzag positions. float64:
  rtol 1e-10.
- bytes: the all-gather of K and V sends (c - 1)/c of each gathered tensor (b T H_kv D
  elements of 8 bytes), the reduce-scatter of dK, dV the same; measured by parlab.comm.
- the closed forms of parlab.cp.compare at a Llama-3-405B-like shape, derived here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parlab import comm, cp, launch

pytestmark = pytest.mark.usefixtures("no_orphans")
B, D, N = 2, 4, 6  # batch, head size, tokens per rank (zigzag chunks of 3)


def _zigzag(world: int) -> torch.Tensor:
    m = N // 2
    rows = [list(range(r * m, (r + 1) * m)) + list(range((2 * world - 1 - r) * m,
                                                         (2 * world - r) * m))
            for r in range(world)]
    return torch.tensor(rows)  # (W, N)


def _mask(lengths: list[int]) -> torch.Tensor:
    t = sum(lengths)
    mask = torch.zeros(t, t, dtype=torch.bool)
    start = 0
    for n in lengths:
        for p in range(start, start + n):
            for j in range(start, p + 1):
                mask[p, j] = True
        start += n
    return mask


def _inputs(world: int, heads: int, kv_heads: int, seed: int = 11):
    gen = torch.Generator().manual_seed(seed)
    t = world * N
    q = torch.randn(B, heads, t, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, t, D, generator=gen, dtype=torch.float64) for _ in "kv")
    dout = torch.randn(B, heads, t, D, generator=gen, dtype=torch.float64)
    return q, k, v, dout


def _worker(heads: int, kv_heads: int, lengths: list[int]) -> dict:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = _inputs(world, heads, kv_heads)
    pos = _zigzag(world)
    doc = cp.document_ids(lengths)
    mine = [x[..., pos[rank], :].clone().requires_grad_() for x in (q, k, v)]
    with comm.trace() as fwd:
        out = cp.allgather_attention(*mine, pos, doc)
    with comm.trace() as bwd:
        out.backward(dout[..., pos[rank], :])
    gathered = cp.gather_from_context_parallel_region(k[..., pos[rank], :], pos)
    return {"out": out.detach(), "grads": [x.grad for x in mine], "gathered": gathered,
            "fwd": fwd.wire_bytes(), "bwd": bwd.wire_bytes(),
            "kinds": ({e.kind for e in fwd.events}, {e.kind for e in bwd.events})}


CASES = [(2, 4, 2, [5, 2, 5]), (2, 2, 2, [12]), (3, 6, 3, [5, 2, 7, 4]), (3, 4, 1, [18])]


@pytest.mark.parametrize("world, heads, kv_heads, lengths", CASES)
def test_allgather_equals_masked_attention(world, heads, kv_heads, lengths):
    results = launch.run(_worker, world, heads, kv_heads, lengths)
    q, k, v, dout = _inputs(world, heads, kv_heads)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    g = heads // kv_heads
    want = F.scaled_dot_product_attention(leaves[0], leaves[1].repeat_interleave(g, 1),
                                          leaves[2].repeat_interleave(g, 1),
                                          attn_mask=_mask(lengths))
    want.backward(dout)
    pos = _zigzag(world)
    gathered = 2 * (world - 1) / world * B * kv_heads * world * N * D * 8  # K and V
    for rank, res in enumerate(results):
        rows = pos[rank]
        torch.testing.assert_close(res["out"], want.detach()[..., rows, :], rtol=1e-10,
                                   atol=1e-12)
        for got, leaf in zip(res["grads"], leaves, strict=True):
            torch.testing.assert_close(got, leaf.grad[..., rows, :], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(res["gathered"], k, rtol=0, atol=0)  # position order
        assert res["kinds"] == ({"all_gather"}, {"reduce_scatter"})
        assert res["fwd"] == pytest.approx(gathered)
        assert res["bwd"] == pytest.approx(gathered)
        assert res["fwd"] == pytest.approx(cp.allgather_bytes_per_layer(
            B, world * N, kv_heads * D, world, 8))


def test_document_ids_and_mask_by_hand():
    assert cp.document_ids([2, 3, 1]).tolist() == [0, 0, 1, 1, 1, 2]
    pos = torch.arange(6)
    torch.testing.assert_close(cp.document_mask(pos, pos, cp.document_ids([2, 3, 1])),
                               _mask([2, 3, 1]))
    rows = torch.tensor([1, 4])  # queries at positions 1 and 4 against every key
    assert cp.document_mask(rows, pos, cp.document_ids([2, 3, 1])).tolist() == [
        [True, True, False, False, False, False], [False, False, True, True, True, False]]
    with pytest.raises(ValueError, match="positive"):
        cp.document_ids([3, 0])


def test_allgather_closed_forms_at_a_llama_405b_shape():
    b, s, c, heads, kv, d, nu = 1, 131072, 16, 128, 8, 128, 2
    h, h_kv = heads * d, kv * d
    own_kv = b * s // c * h_kv * nu  # K (or V) of one rank's tokens
    assert cp.allgather_bytes_per_layer(b, s, h_kv, c, nu) == 2 * (c - 1) * own_kv
    assert cp.allgather_bytes_per_layer(b, s, h_kv, c, nu) == cp.ring_bytes_per_layer(
        b, s, h_kv, c, nu)  # the same forward bytes as the ring, in one collective
    assert cp.allgather_bytes_per_layer(b, s, h_kv, c, nu, backward=True) == 4 * (c - 1) * own_kv
    assert cp.allgather_bytes_per_layer(b, s, h_kv, c, nu, backward=True,
                                        regather=True) == 6 * (c - 1) * own_kv
    assert cp.allgather_bytes_per_layer(b, s, h_kv, 1, nu) == 0.0
    own_q = b * s // c * h * nu
    held = {k: cp.kv_bytes_held(k, b=b, s=s, h=h, h_kv=h_kv, c=c, dtype_bytes=nu)
            for k in ("ring", "ulysses", "allgather")}
    assert held["ring"] == own_q + 6 * own_kv
    assert held["ulysses"] == 2 * (own_q + 2 * own_kv)
    assert held["allgather"] == own_q + 2 * own_kv + 2 * c * own_kv
    assert held["allgather"] > held["ulysses"] > held["ring"]
    with pytest.raises(ValueError, match="ring, ulysses or allgather"):
        cp.kv_bytes_held("tree", b=b, s=s, h=h, h_kv=h_kv, c=c)
    got = cp.attention_comm(b=b, s=s, heads=heads, head_dim=d, c=c, flops=989e12,
                            bandwidth=450e9, kv_heads=kv, backward=True)
    assert got["allgather_bytes"] == 4 * (c - 1) * own_kv
    assert got["allgather_exposed_s"] == pytest.approx(4 * (c - 1) * own_kv / 450e9)
