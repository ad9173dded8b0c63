"""parlab.tp.vocab: the vocabulary-parallel embedding and cross-entropy on 2 and 3 gloo ranks
against PyTorch's own F.embedding and F.cross_entropy on one process.

References computed here, independently of parlab: the whole table looked up by F.embedding,
the whole logits through F.cross_entropy (mean over tokens), both differentiated by autograd in
float64; rank r's share of a gradient is its rows (columns) of the padded table (logits), the
padded part zero. Sizes: V = 12 (divisible by 2 and 3) and V = 13 (neither: padded to 14 and 15,
Megatron-LM's padding with make-vocab-size-divisible-by 1), and a table padded to a multiple of
4·t. Extreme logits (values near 1e4 in float32, where exp overflows) must give a finite loss.
Bytes: the loss sends 3 all-reduces of one number per token, forward only (parlab.comm).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parlab import comm, costs, launch, tp

pytestmark = pytest.mark.usefixtures("no_orphans")
B, S, HID = 2, 5, 3  # batch, sequence, embedding width


def _data(vocab: int, dtype: torch.dtype = torch.float64, scale: float = 1.0):
    gen = torch.Generator().manual_seed(vocab)
    table = torch.randn(vocab, HID, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, vocab, (B, S), generator=gen)
    ids[0, :3] = torch.tensor([0, vocab - 1, vocab // 2])  # both ends of the vocabulary
    up = torch.randn(B, S, HID, generator=gen, dtype=torch.float64)
    logits = (torch.randn(B, S, vocab, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return table, ids, up, logits


def _worker(vocab: int, multiple: int, dtype: torch.dtype, scale: float) -> dict:
    rank, t = torch.distributed.get_rank(), torch.distributed.get_world_size()
    table, ids, up, logits = _data(vocab, dtype, scale)
    emb = tp.VocabParallelEmbedding.from_embedding(torch.nn.Embedding.from_pretrained(
        table, freeze=False), multiple=multiple)
    with comm.trace() as fwd_e:
        y = emb(ids)
    (y * up).sum().backward()
    padded = tp.padded_vocab_size(vocab, t, multiple=multiple)
    start, end = tp.vocab_range(padded, rank, t)
    full = torch.cat([logits, torch.full((B, S, padded - vocab), 1e4, dtype=dtype)], dim=-1)
    shard = full[..., start:end].clone().requires_grad_()  # padding holds a would-be winner
    with comm.trace() as fwd:
        loss = tp.vocab_parallel_cross_entropy(shard, ids, vocab_size=vocab)
    with comm.trace() as bwd:
        loss.backward()
    return {"y": y.detach(), "weight.grad": emb.weight.grad, "loss": loss.detach(),
            "logits.grad": shard.grad, "rows": (start, end), "emb_events": fwd_e.events,
            "fwd": [(e.kind, e.shape) for e in fwd.events], "bwd": len(bwd.events)}


def _reference(vocab: int, dtype: torch.dtype, scale: float):
    table, ids, up, logits = _data(vocab, dtype, scale)
    table.requires_grad_()
    (F.embedding(ids, table) * up).sum().backward()
    x = logits.double().requires_grad_()
    loss = F.cross_entropy(x.reshape(-1, vocab), ids.reshape(-1))
    loss.backward()
    return F.embedding(ids, table).detach(), table.grad, loss.detach(), x.grad


@pytest.mark.parametrize("world,vocab,multiple", [(2, 12, 1), (3, 13, 1), (2, 13, 4)])
def test_matches_embedding_and_cross_entropy_on_one_device(world, vocab, multiple):
    results = launch.run(_worker, world, vocab, multiple, torch.float64, 1.0)
    y, wgrad, loss, lgrad = _reference(vocab, torch.float64, 1.0)
    padded = tp.padded_vocab_size(vocab, world, multiple=multiple)
    assert padded % (multiple * world) == 0 and vocab <= padded < vocab + multiple * world
    pad = torch.zeros(padded - vocab, HID, dtype=torch.float64)
    wgrad_p = torch.cat([wgrad, pad])
    lgrad_p = torch.cat([lgrad.reshape(B, S, vocab), torch.zeros(B, S, padded - vocab,
                                                                  dtype=torch.float64)], dim=-1)
    for res in results:
        start, end = res["rows"]
        assert end - start == padded // world
        torch.testing.assert_close(res["y"], y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(res["weight.grad"], wgrad_p[start:end], rtol=1e-12, atol=0)
        torch.testing.assert_close(res["loss"], loss, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(res["logits.grad"], lgrad_p[..., start:end], rtol=1e-10,
                                   atol=1e-14)
        # the embedding: one all-reduce of (B, S, h); the loss: 3 of one number per token
        assert [e.kind for e in res["emb_events"]] == ["all_reduce"]
        assert res["fwd"] == [("all_reduce", (B * S,))] * 3 and res["bwd"] == 0


def test_extreme_logits_do_not_overflow():
    """float32 logits near ±1e4: exp(1e4) is inf, so only a max-shifted sum stays finite."""
    results = launch.run(_worker, 2, 12, 1, torch.float32, 1e4)
    _, _, loss, lgrad = _reference(12, torch.float32, 1e4)
    assert torch.isfinite(loss) and loss > 100  # the reference is huge and finite
    for rank, res in enumerate(results):
        assert torch.isfinite(res["loss"])
        torch.testing.assert_close(res["loss"].double(), loss, rtol=1e-6, atol=0)
        cols = slice(6 * rank, 6 * rank + 6)
        torch.testing.assert_close(res["logits.grad"].double(),
                                   lgrad.reshape(B, S, 12)[..., cols], rtol=1e-5, atol=1e-7)


def test_padding_and_ranges():
    # Llama 3's 128,256 words: a multiple of 128, but not of 128·8 (Megatron-LM's default)
    assert tp.padded_vocab_size(128256, 8, multiple=128) == 129024
    assert tp.padded_vocab_size(128256, 1, multiple=128) == 128256
    assert tp.padded_vocab_size(13, 3) == 15 and tp.padded_vocab_size(12, 3) == 12
    assert [tp.vocab_range(15, r, 3) for r in range(3)] == [(0, 5), (5, 10), (10, 15)]
    with pytest.raises(ValueError, match="padded_vocab_size"):
        tp.vocab_range(13, 0, 3)
    with pytest.raises(ValueError, match="reduction"):
        tp.vocab_parallel_cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long),
                                        reduction="avg")


def test_one_process_is_plain_cross_entropy():
    """t = 1 without torch.distributed: the same as F.cross_entropy, every reduction."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 7, generator=gen, dtype=torch.float64), torch.tensor([0, 6, 3, 3])
    for reduction in ("mean", "sum", "none"):
        torch.testing.assert_close(tp.vocab_parallel_cross_entropy(x, y, reduction=reduction),
                                   F.cross_entropy(x, y, reduction=reduction))
    emb = torch.nn.Embedding(7, 2)
    torch.testing.assert_close(tp.VocabParallelEmbedding.from_embedding(emb)(y), emb(y))


def test_backward_takes_its_incoming_gradient():
    """The loss scaled by 1/m (module 08's micro-batches) or a per-token upstream gradient
    (reduction "none"): the logits' gradient is F.cross_entropy's times that gradient, not the
    unscaled one (issue 44.1: a backward that drops grad_output passes any test whose upstream
    gradient is 1). One process: the backward is local on every rank anyway."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 9, (6,), generator=gen)
    up = torch.randn(6, generator=gen, dtype=torch.float64)
    for reduction, scale in (("mean", 1 / 8), ("sum", 0.3), ("none", up)):
        mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        (tp.vocab_parallel_cross_entropy(mine, y, reduction=reduction) * scale).sum().backward()
        (F.cross_entropy(ref, y, reduction=reduction) * scale).sum().backward()
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-12, atol=1e-14)


def test_bytes_of_the_logits_against_the_loss():
    b, s, vocab, t = 1, 8192, 128256, 8
    assert costs.logits_bytes(b, s, vocab) == b * s * vocab * 4
    assert tp.vocab_parallel_loss_bytes(b, s, t) == 3 * 2 * 7 / 8 * b * s * 4
    assert tp.gathered_logits_bytes(b, s, vocab, t) == 7 / 8 * b * s * vocab * 4
