r"""What every module-03 check shares: sizes, the likely-mistake sentences, the guard against
parlab's own sequence-parallel code, and the patterns that name a wrong answer.

The in-rank helpers (`env`, `cpu`, `traced`, `backward`, `owns_only`, `unchanged`) and the
comparisons (`close`, `scale`) are module 02's (`parlab.check.tp.common`, `.compare`); here
they are called with `shape_hint=SEQ_DIM` (a shape error speaks of sequence shards) and
`rename=KIND` (the tracer's `*_into_tensor` / `*_tensor` forms counted as their list forms).

Sizes: B = 2 sequences of T = 12 tokens, hidden C = 48 and 12 heads, so t = 2, 3 and 4 all
divide the sequence, the heads and the features (T/t = 6, 4, 3 rows per rank); an answer that
hard-codes the notebook's example sizes, or assumes t is a power of two, fails.
"""

from __future__ import annotations

from typing import Any

import torch

from parlab.check._compare import fail
from parlab.check._harness import not_reference, refuse_in_rank
from parlab.check.tp.common import Events
from parlab.check.tp.compare import close, scale

B, T, H, HEADS = 2, 12, 48, 12
P_DROP = 0.25  # dropout probability of the layer checks
SEED, GEN_SEED = 1234, 77  # weights and inputs; the dropout generator
F32_TOL = {"rtol": 1e-5, "atol": 1e-4}  # values of order 10: see parlab.check.tp.common
EXACT = {"rtol": 0.0, "atol": 0.0}
KIND = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}

# the exercises' keys for `parlab.check.exercise`, and what a later check builds on
KEY_PAIR, KEY_DROPOUT, KEY_BLOCK = "03.sp_pair", "03.sp_dropout", "03.sp_block"
KEY_BYTES, KEY_SAVED = "03.sp_bytes", "03.saved_bytes"
PAIR = {KEY_PAIR: "gather_seq and reduce_scatter_seq (exercise 1)"}
PIECES = {**PAIR, KEY_DROPOUT: "sp_dropout (exercise 2)"}
LAYER = {**PIECES, KEY_BLOCK: "SPBlock (exercise 3)"}

SEQ_DIM = ("activations are (B, T, C) and the sequence is dim 1: all-gather into a list of t "
           "shards and torch.cat(parts, dim=1); for the reduce-scatter split along dim 1 "
           "(x.chunk(t, dim=1), each .contiguous()) and call dist.reduce_scatter(out, parts)")
INTO_TENSOR = ("dist.all_gather_into_tensor stacks the shards along dim 0 (the batch); "
               "reshaping that to (B, T, C) interleaves batch and sequence. " + SEQ_DIM)
GATHER_BACKWARD = ("the all-gather's backward must reduce-scatter: every rank's tensor-parallel "
                   "shard used all T tokens, so each rank holds a partial gradient of every "
                   "token, and rank r needs the sum over ranks of its own rows")
RS_BACKWARD = ("the reduce-scatter's backward must all-gather: rank r holds the gradient of its "
               "own rows only, and every rank's partial sum needs the gradient of all T tokens")
RS_FORWARD = ("the reduce-scatter sums the ranks' (B, T, C) partial results and keeps rows "
              "r*T/t:(r+1)*T/t on rank r")
REPLICATED_GRADS = ("each rank's LayerNorms (and the biases added after a reduce-scatter) saw "
                    "only its own T/t tokens, so their gradients are partial sums: in "
                    "reduce_replicated_grads, all-reduce the gradients of ln1, ln2, proj.bias "
                    "and fc2.bias")
SAME_SEED = ("every rank drew the same (B, T/t, C) mask from the same seed, so every shard "
             "gets the same pattern and none is the single device's: draw the mask of the "
             "whole (B, T, C) activation, as hidden_dropout does, and keep your rows")
BIAS_ONCE = ("the bias is added on every rank before the reduce-scatter, so the sum counts it "
             "t times: add it once, after the reduce-scatter")
ALL_REDUCE = ("an all-reduce sends twice the bytes of a reduce-scatter or an all-gather: "
              "sequence parallelism splits it into those two halves; call dist.reduce_scatter "
              "or dist.all_gather")
HANG = ("a collective that only some ranks call (inside `if rank == ...`), or ranks calling "
        "different collectives: every rank must make the same calls in the same order")


def guard() -> None:
    """Refuse parlab's own sequence-parallel code in this rank (aliases, wrappers and
    subclasses alike)."""
    from parlab.tp import block, mappings, sequence

    refuse_in_rank([mappings._GatherFromSequenceParallelRegion,
                    mappings._ReduceScatterToSequenceParallelRegion,
                    mappings._ScatterToSequenceParallelRegion, sequence._shard_keep_mask,
                    sequence._allreduce_grads, block.SPBlock],
                   "parlab.tp's sequence parallelism")


def reject_reference(obj: Any, name: str) -> None:
    not_reference(obj, name=name, modules=("parlab.tp", "parlab.costs.activations"))


def rows(x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
    """Rank's rows of the sequence (dim 1) of a (B, T, C) tensor."""
    n = x.shape[1] // t
    return x[:, rank * n:(rank + 1) * n]


def story(got: Any, candidates: list[tuple[Any, str]], tol: float = 1e-9) -> str | None:
    """The hint of the first candidate wrong answer that `got` equals, if any."""
    for wrong, hint in candidates:
        if isinstance(got, torch.Tensor) and isinstance(wrong, torch.Tensor) \
                and got.shape == wrong.shape and close(got, wrong, rtol=tol, atol=tol):
            return hint
    return None


def kinds(events: Events) -> str:
    return ", ".join(f"{k} {tuple(s)}" for k, s, _ in events) or "none"


def expect_kinds(results: list, phase: str, where: str, want: list[str], hint: str) -> None:
    """Every rank's `phase` made exactly the collectives `want` (an all-reduce: ALL_REDUCE)."""
    for rank, res in enumerate(results):
        got = [k for k, _, _ in res[phase]]
        if got != want:
            fail(f"the {phase} of {where} made these collective calls: {kinds(res[phase])}; "
                 f"expected {', '.join(want) or 'none'}", rank=rank,
                 hint=ALL_REDUCE if "all_reduce" in got else hint)


def times(got: Any, ref: torch.Tensor) -> float | None:
    c = scale(got, ref)
    return c if c is not None and abs(c - 1) > 1e-3 else None
