r"""Shared machinery of the module-03 checks (`parlab.check.sp`, `sp_block`, `sp_memory`).

Reused from module 02 (`parlab.check.tp_common`): `_env`, `_cpu`, `_close`, `_scale`, `_run`
(ranks; a hang or an in-rank CheckFailed becomes CheckFailed). Here: the guard that makes
parlab's own sequence-parallel code raise in the ranks, a crash report whose hint speaks of
sequence shards, the tracer with `*_into_tensor` / `*_tensor` counted as their list forms,
and `_story`, which names a mistake by recognising the wrong answer it produces.

Sizes: B = 2 sequences of T = 8 tokens (T/t = 4 or 2 rows per rank), hidden C = 16, 4 heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check import call_learner, fail, not_reference, refuse_in_rank
from parlab.check.tp_common import _backward as tp_backward
from parlab.check.tp_common import _close, _cpu, _env, _run, _scale  # noqa: F401 - re-exported

B, T, H, HEADS = 2, 8, 16, 4
P = 0.25  # dropout probability of the layer checks
SEED, GEN_SEED = 1234, 77  # weights and inputs; the dropout generator
F32_TOL = {"rtol": 1e-5, "atol": 1e-6}
EXACT = {"rtol": 0.0, "atol": 0.0}

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
_KIND = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


# --- in the ranks ------------------------------------------------------------------------------

def _guard() -> None:
    """Refuse parlab's own sequence-parallel code in this rank (aliases, wrappers and
    subclasses alike)."""
    from parlab.tp import block, mappings, sequence

    refuse_in_rank([mappings._GatherFromSequenceParallelRegion,
                    mappings._ReduceScatterToSequenceParallelRegion,
                    mappings._ScatterToSequenceParallelRegion, sequence._shard_keep_mask,
                    sequence._allreduce_grads, block.SPBlock],
                   "parlab.tp's sequence parallelism")


def _call(stage: str, fn: Callable[..., Any], *args: Any, hint: str | None = None) -> Any:
    """Run learner code; a crash becomes CheckFailed saying where (stubs raise as they are)."""
    return call_learner(stage, fn, *args, hint=hint, shape_hint=SEQ_DIM)


def _traced(stage: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple]]:
    """(result, [(kind, shape, wire bytes), ...]) with *_into_tensor / *_tensor renamed."""
    from parlab import comm

    with comm.trace() as tr:
        out = _call(stage, fn, *args)
    return out, [(_KIND.get(e.kind, e.kind), tuple(e.shape), e.wire_bytes) for e in tr.events]


def _backward(stage: str, y: Any, upstream: torch.Tensor, rank: int, what: str) -> list[tuple]:
    """Backward of sum(y * upstream), traced; y must have upstream's shape (`what` says why)."""
    return tp_backward(stage, y, upstream, rank, what, traced=_traced)


# --- in the parent -----------------------------------------------------------------------------

def _reject_reference(obj: Any, name: str) -> None:
    not_reference(obj, name=name, modules=("parlab.tp", "parlab.costs.activations"))


def _rows(x: torch.Tensor, rank: int, t: int) -> torch.Tensor:
    """Rank's rows of the sequence (dim 1) of a (B, T, C) tensor."""
    n = x.shape[1] // t
    return x[:, rank * n:(rank + 1) * n]


def _story(got: Any, candidates: list[tuple[Any, str]]) -> str | None:
    """The hint of the first candidate wrong answer that `got` equals, if any."""
    for wrong, hint in candidates:
        if isinstance(got, torch.Tensor) and isinstance(wrong, torch.Tensor) \
                and got.shape == wrong.shape and _close(got, wrong, rtol=1e-9, atol=1e-9):
            return hint
    return None


def _kinds(events: list[tuple]) -> str:
    return ", ".join(f"{k} {tuple(s)}" for k, s, _ in events) or "none"


def _expect_kinds(results: list, phase: str, where: str, want: list[str], hint: str) -> None:
    """Every rank's `phase` made exactly the collectives `want` (an all-reduce: ALL_REDUCE)."""
    for rank, res in enumerate(results):
        got = [k for k, _, _ in res[phase]]
        if got != want:
            fail(f"the {phase} of {where} made these collective calls: {_kinds(res[phase])}; "
                 f"expected {', '.join(want) or 'none'}", rank=rank,
                 hint=ALL_REDUCE if "all_reduce" in got else hint)


def _times(got: Any, ref: torch.Tensor) -> float | None:
    c = _scale(got, ref)
    return c if c is not None and abs(c - 1) > 1e-3 else None
