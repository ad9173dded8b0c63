r"""Module 02, exercises 7 and 8: the vocabulary-parallel embedding and cross-entropy.

Exercise 7, `check_vocab_embedding(VocabParallelEmbedding, world_size=, vocab=)`: a random
nn.Embedding(V, 6) in float64; rank r's `weight` must be its ⌈V/t⌉ rows (the padding past V
zero); the lookup of every id (and random ones) against F.embedding on one process, the same on
every rank, and the gradient of each rank's rows (the padded rows' zero) against autograd's,
for a random upstream gradient, rtol 1e-10. One all-reduce forward, none backward (g).

Exercise 8, `check_vocab_cross_entropy(vocab_parallel_cross_entropy, world_size=, vocab=)`:
float32 logits split by columns, the padded columns past V holding a value above every real
logit (they must be excluded), in two cases: 2 × 6 tokens of ordinary logits, and 3 × 5 tokens
of logits near 1e4, where exp overflows unless the maximum is subtracted first. The loss (a 0-d
tensor, the mean over tokens, the same on every rank) against F.cross_entropy on one process in
float64 (rtol 1e-5; the float32 inputs are exact there), and the gradient of each rank's
columns against autograd's for an upstream gradient that is not 1: a random scalar in the
first case, 1/8 in the second (the loss of one of 8 micro-batches, as module 08 scales it), so
a backward that drops its incoming gradient fails. What it sends is measured (parlab.comm): at
most four all-reduces of one float64 per token in all, so an answer that all-gathers (or
all-reduces) the logits is refused for its bytes, with right values.

A right answer does not depend on, and the tests vary:
- the world size t, V, and whether t divides V: visible 2 ranks with V = 37 (padded to 38) and
  V = 36 (no padding), in one launch (`vocab=(37, 36)`); hidden 3 ranks with V = 37 (padded
  to 39), 4 with V = 36;
- which rank holds an id or a target: every id is looked up, targets 0 and V - 1 included;
- the upstream gradient: random per entry (exercise 7), a random scalar and 1/8 (exercise 8);
- the tokens' number and shape ((2, 6) and (3, 5)) and the logits' size (ordinary, near 1e4);
- what the padded columns hold (a would-be winner, never counted).
Fixed on purpose: float32 logits (the loss runs in float32; Megatron-LM casts the logits to it).

References are computed in the kernel (never in a rank); in the ranks parlab's TP code is
refused (`common.guard` and this module's `REFUSED`), and so is a re-export before anything
runs. A wrong value is matched against the wrong answers `vocab_hints` rebuilds; where two of
them give the same numbers, the hint names both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, refuse_in_rank, run_checked
from parlab.check.tp import vocab_hints as vh
from parlab.check.tp.common import (
    F64_TOL,
    backward,
    cpu,
    env,
    guard,
    learner_mode,
    nonleaf,
    owns_only,
    param,
    traced,
    unchanged,
)
from parlab.check.tp.compare import reject_reference, scale
from parlab.check.tp.keys import F_G

__all__ = ["check_vocab_embedding", "check_vocab_cross_entropy", "KEY_EMBEDDING", "KEY_LOSS"]
KEY_EMBEDDING, KEY_LOSS = "02.vocab_embedding", "02.vocab_cross_entropy"
HID = 6  # embedding width
CASES = ((False, (2, 6)), (True, (3, 5)))  # (logits near 1e4?, tokens (batch, sequence))
MICRO_BATCHES = 8  # the second case's loss is one micro-batch's of 8: upstream 1/8
F32 = {"rtol": 1e-5, "atol": 1e-6}


def _refuse() -> None:
    from parlab.tp import vocab

    guard()
    refuse_in_rank([vocab.VocabParallelEmbedding, vocab._VocabParallelCrossEntropy,
                    vocab.vocab_parallel_cross_entropy], "parlab.tp")


def _table(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(table (V, h), ids (2, V): every id once then random ones, upstream gradient)."""
    gen = torch.Generator().manual_seed(700 + vocab)
    table = torch.randn(vocab, HID, generator=gen, dtype=torch.float64)
    ids = torch.stack([torch.randperm(vocab, generator=gen),
                       torch.randint(0, vocab, (vocab,), generator=gen)])
    return table, ids, torch.randn(2, vocab, HID, generator=gen, dtype=torch.float64)


def _sizes(vocab: int | tuple[int, ...]) -> tuple[int, ...]:
    """The vocabulary sizes one check runs, in one launch (padded and not, e.g. (37, 36))."""
    return (vocab,) if isinstance(vocab, int) else tuple(vocab)


def _embedding_worker(cls: type, vocabs: tuple[int, ...]) -> list[dict]:
    rank, t, dev = env()
    _refuse()
    return [_embedding_one(cls, vocab, rank, t, dev) for vocab in vocabs]


def _embedding_one(cls: type, vocab: int, rank: int, t: int, dev: torch.device) -> dict:
    table, ids, up = (x.to(dev) for x in _table(vocab))
    n = vh.padded_rows(vocab, t)
    given = table.clone()
    if learner_mode():  # under the verifier: the other ranks' rows are not this rank's to use
        own = torch.zeros(vocab, dtype=torch.bool, device=dev)
        own[rank * n:(rank + 1) * n] = True
        given[~own] = float("nan")
    emb = torch.nn.Embedding.from_pretrained(given, freeze=False)
    model, _ = traced("VocabParallelEmbedding(embedding)", cls, emb, shape_hint=vh.SHARD)
    owns_only(model, rank)
    weight = param(model, "weight", rank)
    if tuple(weight.shape) != (n, HID):
        fail(f"weight has shape {tuple(weight.shape)} on {t} ranks with V = {vocab}; expected "
             f"({n}, {HID}): ceil(V / t) rows of the table", rank=rank,
             hint=vh.rows_hint(weight.shape[0] if weight.dim() else -1, vocab, t))
    kept = ids.clone()

    def lookup(x: torch.Tensor) -> Any:
        try:
            return model(x)
        except IndexError as exc:  # F.embedding of an id past the shard's rows
            fail(f"VocabParallelEmbedding.forward raised IndexError: {exc}", rank=rank,
                 hint=vh.NO_SHIFT)

    y, fwd = traced("VocabParallelEmbedding.forward", lookup, ids, shape_hint=vh.NO_SHIFT)
    unchanged(kept, ids, "ids (the tensor given to forward)", rank)
    bwd = backward("VocabParallelEmbedding.forward", y, up, rank,
                   hint=f"return the (..., {HID}) vectors of the ids, the same on every rank")
    return {"y": cpu(y), "weight": cpu(weight), "grad": cpu(weight.grad),
            "events": ([k for k, _, _ in fwd], [k for k, _, _ in bwd])}


def _compare_embedding(results: list[dict], vocab: int, t: int) -> None:
    table, ids, up = _table(vocab)
    leaf = table.clone().requires_grad_()
    y = F.embedding(ids, leaf)
    (y * up).sum().backward()
    n = vh.padded_rows(vocab, t)
    assert leaf.grad is not None
    grad = torch.cat([leaf.grad, table.new_zeros(n * t - vocab, HID)])
    rows = torch.cat([table, table.new_zeros(n * t - vocab, HID)])
    for rank, res in enumerate(results):
        real = slice(0, max(0, min(n, vocab - rank * n)))
        assert_close(res["weight"][real], rows[rank * n:(rank + 1) * n][real], rank=rank,
                     name=f"weight rows {rank * n}..", hint=vh.SHARD, **F64_TOL)
        hint = None
        if torch.allclose(res["y"], vh.lookup_not_zeroed(table, ids, t)):
            hint = vh.NO_ZERO
        elif t > 1 and torch.allclose(sum(r["y"] for r in results), y.detach()):
            hint = vh.NO_REDUCE
        assert_close(res["y"], y.detach(), name=f"the embedding of ids (2, {vocab})",
                     rank=rank, hint=hint or vh.LOOKUP, **F64_TOL)
        mine = grad[rank * n:(rank + 1) * n]
        c = scale(res["grad"], mine)
        assert_close(res["grad"], mine, name="weight.grad", rank=rank, **F64_TOL,
                     hint=vh.G_TWICE if c is not None and abs(c - t) < 1e-6 else
                     vh.EMBEDDING_GRAD)
        fwd, bwd = res["events"]
        if fwd != ["all_reduce"] or bwd:
            fail(f"the forward made {fwd or 'no collectives'} and the backward "
                 f"{bwd or 'no collectives'}; expected one all-reduce forward, none backward",
                 rank=rank, hint=vh.G_TWICE if bwd else vh.NO_REDUCE if not fwd else
                 "one all-reduce of the partial outputs in forward (g), nothing else")


@exercise(KEY_EMBEDDING, needs=F_G)
def check_vocab_embedding(cls: type, *, world_size: int = 2, vocab: int | tuple[int, ...] = 37,
                          timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 7: cls(embedding) on `world_size` ranks against F.embedding, for each V in
    `vocab` (one launch; module doc)."""
    reject_reference(cls, "VocabParallelEmbedding")
    vocabs, t = _sizes(vocab), world_size
    results = run_checked(_embedding_worker, t, cls, vocabs,
                          what="VocabParallelEmbedding", timeout=timeout, hang_hint=vh.HANG)
    for i, v in enumerate(vocabs):
        _compare_embedding([res[i] for res in results], v, t)
    if not quiet:
        tables = "; ".join(f"V = {v} padded to {vh.padded_rows(v, t) * t}, "
                           f"{vh.padded_rows(v, t)} rows each" for v in vocabs)
        print(f"VocabParallelEmbedding OK on {t} ranks: {tables}; the lookup of every id "
              "matches F.embedding and each rank's rows get their share of the gradient, one "
              "all-reduce forward")


def _logits(vocab: int, t: int, extreme: bool,
            tokens: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(float32 logits (*tokens, t n), the padded columns a would-be winner; targets
    (*tokens); the upstream gradient of the loss: a random scalar, or 1/MICRO_BATCHES)."""
    gen = torch.Generator().manual_seed(900 + vocab + 10 * t + extreme)
    n = vh.padded_rows(vocab, t)
    x = torch.randn(*tokens, vocab, generator=gen, dtype=torch.float64) * (1e4 if extreme else 3)
    win = x.amax() + 50.0
    full = torch.cat([x, win.expand(*tokens, n * t - vocab)], dim=-1).float()
    target = torch.randint(0, vocab, tokens, generator=gen)
    target[0, :2] = torch.tensor([0, vocab - 1])
    up = 1 / MICRO_BATCHES if extreme else round(1.5 + float(torch.rand((), generator=gen)), 3)
    return full, target, up


def _upstream(up: float) -> str:
    return (f"the loss divided by {MICRO_BATCHES} micro-batches, upstream gradient "
            f"1/{MICRO_BATCHES}" if up == 1 / MICRO_BATCHES else f"upstream gradient {up:g}")


def _loss_worker(fn: Callable, vocabs: tuple[int, ...]) -> list[list[dict]]:
    rank, t, dev = env()
    _refuse()
    return [_loss_one(fn, vocab, rank, t, dev) for vocab in vocabs]


def _loss_one(fn: Callable, vocab: int, rank: int, t: int, dev: torch.device) -> list[dict]:
    out = []
    for extreme, tokens in CASES:
        full, target, up = _logits(vocab, t, extreme, tokens)
        n = full.shape[-1] // t
        shard = full[..., rank * n:(rank + 1) * n].contiguous().to(dev)
        leaf, given = nonleaf(shard)
        tgt = target.to(dev)
        loss, fwd = traced("vocab_parallel_cross_entropy(logits_shard, target, vocab_size)",
                           fn, given, tgt, vocab, shape_hint=vh.BACKWARD)
        unchanged(shard, given, "logits_shard", rank)
        unchanged(target, tgt, "target", rank)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            fail(f"the loss is {shape}, expected a 0-dimensional tensor", rank=rank,
                 hint=vh.NOT_MEAN if isinstance(loss, torch.Tensor) else vh.REPLICATED)
        # backward of up * loss: its incoming gradient is up, not 1 (module 08 divides by m)
        bwd = backward(f"vocab_parallel_cross_entropy ({_upstream(up)})", loss,
                       torch.full((), up, dtype=loss.dtype, device=dev), rank,
                       hint=vh.REPLICATED, shape_hint=vh.BACKWARD)
        out.append({"loss": cpu(loss), "grad": cpu(leaf.grad), "events": fwd + bwd})
    return out


def _compare_loss(results: list[dict], vocab: int, t: int, extreme: bool,
                  tokens: tuple[int, int]) -> None:
    full, target, up = _logits(vocab, t, extreme, tokens)
    n = full.shape[-1] // t
    x = full[..., :vocab].double().requires_grad_()
    want = F.cross_entropy(x.reshape(-1, vocab), target.reshape(-1))
    (want * up).backward()
    assert x.grad is not None
    grad = torch.cat([x.grad, x.new_zeros(*tokens, n * t - vocab)], dim=-1)
    count = full[..., 0].numel()
    case = (f"{'logits near 1e4' if extreme else 'ordinary logits'}, {tokens[0]} x {tokens[1]} "
            f"tokens, V = {vocab} on {t} ranks")
    flat = full.reshape(-1, n * t)
    for rank, res in enumerate(results):
        got = res["loss"]
        story = (vh.loss_story(float(got), flat, target.reshape(-1), vocab, t)
                 if torch.isfinite(got).all() else vh.MAX_SHIFT)
        assert_close(got, want.detach(), name=f"the loss ({case})", rank=rank, **F32,
                     hint=story or vh.LOSS)
        mine = grad[..., rank * n:(rank + 1) * n]
        assert_close(res["grad"], mine, name=f"the gradient of logits_shard ({case}, "
                     f"{_upstream(up)})", rank=rank, **F32,
                     hint=vh.grad_story(scale(res["grad"], mine), up=up, tokens=count, t=t))
        sent = sum(b for _, _, b in res["events"])
        if sent > 4 * 2 * (t - 1) / t * count * 8:  # four all-reduces of a float64 per token
            calls = ", ".join(f"{k} {tuple(s)}" for k, s, _ in res["events"])
            fail(f"right values, but this rank sent {sent:,.0f} bytes ({calls}); three "
                 f"all-reduces of one float32 per token send "
                 f"{3 * 2 * (t - 1) / t * count * 4:,.0f}, and this rank's logits are "
                 f"{n * count * 4:,} bytes", rank=rank, hint=vh.GATHER)


@exercise(KEY_LOSS)
def check_vocab_cross_entropy(fn: Callable[..., Any], *, world_size: int = 2,
                              vocab: int | tuple[int, ...] = 37,
                              timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 8: fn(logits_shard, target, vocab_size) on `world_size` ranks against
    F.cross_entropy, ordinary and extreme logits, for each V in `vocab` (one launch), and the
    bytes it sends (module doc)."""
    reject_reference(fn, "vocab_parallel_cross_entropy")
    vocabs, t = _sizes(vocab), world_size
    results = run_checked(_loss_worker, t, fn, vocabs, what="vocab_parallel_cross_entropy",
                          timeout=timeout, hang_hint=vh.HANG)
    for i, v in enumerate(vocabs):
        for case, (extreme, tokens) in enumerate(CASES):
            _compare_loss([res[i][case] for res in results], v, t, extreme, tokens)
    if not quiet:
        cols = "; ".join(f"{vh.padded_rows(v, t)} of {vh.padded_rows(v, t) * t} columns each "
                         f"for V = {v}" for v in vocabs)
        print(f"vocab_parallel_cross_entropy OK on {t} ranks: {cols} (the padding excluded), "
              "loss and gradient match "
              "F.cross_entropy for ordinary logits and logits near 1e4, with upstream "
              f"gradients other than 1 (1/{MICRO_BATCHES} included), with one number per token "
              "per all-reduce")
