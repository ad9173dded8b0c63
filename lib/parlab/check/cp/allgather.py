r"""Exercise 6 of module 05, `check_allgather(allgather_attention)`: Llama 3's all-gather CP.

On world_size = W ranks, each holding N = 6 tokens (T = 6W) in the zigzag layout (chunks of
3; rank r holds chunks r and 2W - 1 - r), key/value heads of size D = 4, batch 2, float64,
two sequences:
1. one document (the mask is causal only), H = 4 query heads over H_kv = 2 key/value heads;
2. packed documents whose boundaries fall inside the zigzag chunks (lengths 5, 2, 7, 4, ...,
   the last cut short; on 4 ranks a document of one token), H = 6 over H_kv = 2.
A right answer must not depend on W (the visible test runs 2 and 3 ranks, the hidden one 4:
a list of W tensors for the gather, W parts for the reduce-scatter), on how many query heads
share a key/value head (2, then 3: read H and H_kv from q and k), on which positions a rank
holds (the zigzag's, given as pos) or on where the documents begin (given as doc).
`allgather_attention(q, k, v, pos, doc)` gets rank r's rows of q (B, H, N, D) and k, v
(B, H_kv, N, D) as leaves that require grad, pos (W, N) every rank's global positions and doc
(T,) every position's document id; its output must match, row for row, softmax attention on
one device under the mask "same document and not later" (the check's own float64 softmax,
autograd for the gradients), rtol 1e-10; then the output's backward must give q.grad, k.grad
and v.grad equal to the single-device gradients of rank r's tokens: dK and dV summed over
every rank's queries (the all-gather's backward is a reduce-scatter). Inputs unchanged.
A wrong output or gradient is compared with what each foreseen mistake computes (the causal
mask from local positions, the documents ignored, K/V in rank order, the grouped-query heads
paired wrongly, the gradient kept on its own rank or reduce-scattered in position order) and
the one it matches is named. parlab's own all-gather attention and the sequence-parallel
gather of `parlab.tp` are refused while the learner's code runs. It uses no earlier exercise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from parlab.check._compare import assert_close, assert_unchanged, fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    cpu,
    env,
    exercise,
    not_reexport,
    run_checked,
)
from parlab.cp import allgather
from parlab.tp import mappings

__all__ = ["check_allgather", "SIZES", "REFUSED"]

B, N, D = 2, 6, 4  # batch, tokens per rank, head size
# (what the sequence holds, packed documents?, query heads H, key/value heads H_kv): H / H_kv
# is 2, then 3, so that an answer must read the grouping from q and k
CASES = (("one document", False, 4, 2),
         ("packed documents crossing the chunk boundaries", True, 6, 2))
H, HKV = CASES[0][2:]  # the first case's, which the notebook's text names
SIZES = {"batch": B, "heads": [c[2] for c in CASES], "kv_heads": [c[3] for c in CASES],
         "tokens_per_rank": N, "head_dim": D}
RTOL, ATOL = 1e-10, 1e-12  # float64: only the summation order differs
REFUSED = [allgather.allgather_attention, allgather.gather_from_context_parallel_region,
           mappings.gather_from_sequence_parallel_region,
           mappings._GatherFromSequenceParallelRegion]
REFUSAL = ("parlab.cp.allgather_attention / gather_from_context_parallel_region (and "
           "parlab.tp's gather_from_sequence_parallel_region)")
LOCAL = ("the causal mask compares local indices: under the zigzag layout rank r's queries "
         "sit at the global positions pos[r] (chunks r and 2W - 1 - r), not at 0..n-1 or "
         "r*n..(r+1)*n-1; compare pos[rank] with the keys' global positions")
DOCS = ("the mask ignores the documents: a query attends only to keys of its own document, "
        "doc[key position] == doc[query position], at or before its own position")
RANK_ORDER = ("the gathered keys are in rank order (rank 0's tokens, then rank 1's, ...) but "
              "the mask treats gathered key j as position j: under zigzag put K and V in "
              "position order (index them by torch.argsort(pos.flatten())), or build the "
              "mask from the gathered keys' positions, pos.flatten()")
GQA = ("query head h reads key/value head h // (H // H_kv): expand K and V with "
       ".repeat_interleave(H // H_kv, dim=1); .repeat(1, H // H_kv, 1, 1) pairs head h with "
       "h % H_kv")
NO_GRAPH = ("dist.all_gather fills new tensors that carry no autograd graph: make the gather "
            "a torch.autograd.Function whose backward reduce-scatters the gradient (sums every "
            "rank's terms and hands each rank the rows of its own tokens)")
OWN_ONLY = ("the backward kept only this rank's rows of the gathered gradient, the terms of "
            "its own queries: every rank's queries read every key, so dK and dV must be summed "
            "over the ranks and each rank given its own rows: a reduce-scatter (or an "
            "all-reduce, then your own rows)")
POSITION_RS = ("the backward reduce-scattered the gradient in position order, so rank r got "
               "the rows of positions r*n..(r+1)*n-1: undo the forward's reordering (back to "
               "rank order) before the reduce-scatter")
AVERAGED = ("dK and dV are the sum over ranks divided by W: the gradient of a gathered key "
            "is the sum of every rank's terms, not their mean")
GROUPS = ("q is (B, H, n, D), k and v (B, H_kv, n, D) with fewer heads: expand the gathered K "
          "and V to H heads, .repeat_interleave(H // H_kv, dim=1), with H and H_kv read from "
          "q.shape[1] and k.shape[1] (the check's cases group 2, then 3 query heads per "
          "key/value head)")
HANG = ("every rank must make the same collectives, the same number of times, with tensors "
        "of the same size: the all-gathers of K and V forward, their reduce-scatters backward")


def zigzag(world: int) -> Tensor:
    """(W, N) int64: rank r's positions, chunks r and 2W - 1 - r of N/2 tokens."""
    m = N // 2
    rows = [torch.cat([torch.arange(r * m, (r + 1) * m),
                       torch.arange((2 * world - 1 - r) * m, (2 * world - r) * m)])
            for r in range(world)]
    return torch.stack(rows)


def documents(world: int, packed: bool) -> Tensor:
    """(T,) int64 document ids: one document, or lengths 5, 2, 7, 4, ... (the last cut)."""
    t = world * N
    if not packed:
        return torch.zeros(t, dtype=torch.int64)
    ids, start, i = torch.empty(t, dtype=torch.int64), 0, 0
    while start < t:
        n = (5, 2, 7, 4)[i % 4]
        ids[start:start + n] = i
        start, i = start + n, i + 1
    return ids


def _tensors(world: int, case: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(560 + 10 * world + case)
    t, (_, _, heads, kv_heads) = world * N, CASES[case]
    return [torch.randn(B, h, t, D, generator=gen, dtype=torch.float64)
            for h in (heads, kv_heads, kv_heads, heads)]  # q, k, v, dout


def _worker(fn: Callable) -> list[dict]:
    return [_case(fn, i, packed) for i, (_, packed, _, _) in enumerate(CASES)]


def _case(fn: Callable, case: int, packed: bool) -> dict:
    from parlab import comm

    rank, world, dev = env()
    q, k, v, dout = _tensors(world, case)
    pos = zigzag(world)
    rows = pos[rank]
    mine = [x[..., rows, :].to(dev).requires_grad_() for x in (q, k, v)]
    kept = [cpu(x) for x in mine]
    where = f"allgather_attention on {world} ranks ({CASES[case][0]})"
    with comm.trace() as fwd:
        out = call_learner(where, fn, *mine, pos.to(dev), documents(world, packed).to(dev),
                           refuse=REFUSED, refusal=REFUSAL,
                           shape_hint=GROUPS)
    want = (B, CASES[case][2], N, D)
    if not isinstance(out, Tensor) or tuple(out.shape) != want:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        fail(f"{where} returned {shape}, expected {want}", rank=rank,
             hint="return this rank's output rows: (B, H, n, D), its own queries only")
    for name, before, after in zip("qkv", kept, mine, strict=True):
        assert_unchanged(before, after, name=name, rank=rank)
    if out.grad_fn is None:
        fail(f"{where} returned a tensor with no autograd graph", rank=rank,
             hint="compute the output from q, k and v with torch operations autograd can "
             "follow (no .detach(), no torch.no_grad()); " + NO_GRAPH)
    with comm.trace() as bwd:
        call_learner(f"the backward of {where}", out.backward, dout[..., rows, :].to(dev),
                     refuse=REFUSED, refusal=REFUSAL)
    return {"out": cpu(out), "grads": [None if x.grad is None else cpu(x.grad) for x in mine],
            "bytes": (fwd.wire_bytes(), bwd.wire_bytes())}


def _attend(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, *, interleave: bool = True
            ) -> Tensor:
    """float64 softmax attention under an (nq, nk) boolean mask, K/V heads expanded."""
    g = q.shape[1] // k.shape[1]
    k, v = ((x.repeat_interleave(g, 1) if interleave else x.repeat(1, g, 1, 1)) for x in (k, v))
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    return torch.softmax(s, dim=-1) @ v


def _close(got: Tensor, want: Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, rtol=RTOL, atol=ATOL)


def _allowed(q_pos: Tensor, k_pos: Tensor, doc: Tensor | None, *, doc_q: Tensor | None = None
             ) -> Tensor:
    causal = k_pos[None, :] <= q_pos[:, None]
    if doc is None:
        return causal
    dq = doc[q_pos] if doc_q is None else doc_q
    return causal & (dq[:, None] == doc[k_pos][None, :])


def _output_story(got: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, doc: Tensor,
                  rank: int) -> str:
    """The foreseen mistake whose output this rank's `got` (B, H, N, D) matches."""
    rows = pos[rank]
    keys, qr = torch.arange(pos.numel()), q[..., rows, :]
    rank_order = pos.reshape(-1)
    candidates = []
    for wrong in (torch.arange(N), rank * N + torch.arange(N)):
        for doc_q in (doc[rows], doc[wrong]):
            candidates.append((LOCAL, _attend(qr, k, v, _allowed(wrong, keys, doc,
                                                                 doc_q=doc_q))))
        candidates.append((LOCAL, _attend(qr, k, v, _allowed(wrong, keys, None))))
    candidates += [
        (DOCS, _attend(qr, k, v, _allowed(rows, keys, None))),
        (RANK_ORDER, _attend(qr, k[..., rank_order, :], v[..., rank_order, :],
                             _allowed(rows, keys, doc))),
        (GQA, _attend(qr, k, v, _allowed(rows, keys, doc), interleave=False)),
    ]
    for hint, want in candidates:
        if want.shape == got.shape and _close(got, want):
            return hint
    return ("query i of rank r sits at position p = pos[r][i]; it attends to the gathered "
            "keys at positions j <= p with doc[j] == doc[p], softmax of q.k / sqrt(D); K and "
            "V gathered from every rank (K/V head h // (H // H_kv) for query head h)")


def _grad_story(got: Tensor, which: int, full: Tensor, tensors: list[Tensor], pos: Tensor,
                doc: Tensor, rank: int) -> str:
    """The foreseen mistake whose dk or dv (which = 1, 2) this rank's `got` matches; `full`
    is the single-device gradient of the whole sequence, tensors (q, k, v, dout)."""
    rows, world = pos[rank], pos.shape[0]
    if which:
        own = _own_grads(tensors, rows, doc)[which][..., rows, :]
        contiguous = full[..., rank * N:(rank + 1) * N, :]
        for hint, want in ((OWN_ONLY, own), (POSITION_RS, contiguous),
                           (AVERAGED, full[..., rows, :] / world)):
            if _close(got, want):
                return hint
    return ("the output is right: check the gather's backward, a reduce-scatter of the "
            "gradient in the order the tokens were gathered")


def _check_case(results: list[dict], world: int, case: int) -> None:
    label, packed, heads, kv_heads = CASES[case]
    q, k, v, dout = _tensors(world, case)
    pos, doc = zigzag(world), documents(world, packed)
    every = torch.arange(world * N)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _attend(leaves[0], leaves[1], leaves[2], _allowed(every, every, doc))  # (B, H, T, D)
    out.backward(dout)
    what = (f"all-gather attention on {world} ranks, {label} ({heads} query, {kv_heads} "
            "key/value heads)")
    for rank, res in enumerate(results):
        rows = pos[rank]
        want = out.detach()[..., rows, :]
        _compare(res["out"], want, f"{what}: output", rank, _output_story, res["out"], q, k, v,
                 pos, doc, rank)
        for i, (name, got, leaf) in enumerate(zip(("dq", "dk", "dv"), res["grads"], leaves,
                                                  strict=True)):
            assert leaf.grad is not None, "autograd reached every input of the reference"
            if got is None:
                fail(f"{what}: {name[1]}.grad is None after the backward: no gradient reached "
                     f"this rank's {name[1]}", rank=rank, hint=NO_GRAPH if i else
                     "compute the output from q with torch operations autograd can follow")
            _compare(got, leaf.grad[..., rows, :], f"{what}: {name}", rank, _grad_story, got,
                     i, leaf.grad, [q, k, v, dout], pos, doc, rank)


def _compare(got: Tensor, want: Tensor, name: str, rank: int, story: Callable[..., str],
             *args: Any) -> None:
    """assert_close, with the likely mistake, story(*args), worked out only when the values
    differ."""
    hint = story(*args) if isinstance(got, Tensor) and got.shape == want.shape and not _close(
        got.double(), want) else None
    assert_close(got, want, name=name, rank=rank, rtol=RTOL, atol=ATOL, hint=hint)


def _own_grads(tensors: list[Tensor], rows: Tensor, doc: Tensor) -> list[Tensor]:
    """Gradients (full sequence) of one rank's query rows alone: what a gather whose backward
    keeps its own rows gives; tensors (q, k, v, dout)."""
    q, k, v, dout = tensors
    every = torch.arange(q.shape[2])
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _attend(leaves[0], leaves[1], leaves[2], _allowed(every, every, doc))
    keep = torch.zeros_like(dout)
    keep[..., rows, :] = dout[..., rows, :]
    out.backward(keep)
    return [x.grad for x in leaves]  # type: ignore[misc]


@exercise("05.allgather")
def check_allgather(allgather_attention: Callable, *, world_size: int = 2,
                    timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 6: all-gather attention with a document mask on `world_size` ranks, outputs
    and gradients against one device (module docstring)."""
    not_reexport(allgather_attention, name="allgather_attention")
    results = run_checked(_worker, world_size, allgather_attention,
                          what="all-gather attention", timeout=timeout, hang_hint=HANG)
    for case in range(len(CASES)):
        _check_case([res[case] for res in results], world_size, case)
    if not quiet:
        fwd, bwd = results[0][1]["bytes"]  # the packed documents' case
        heads, kv = CASES[1][2:]
        formula = 2 * (world_size - 1) / world_size * B * kv * world_size * N * D * 8
        print(f"All-gather attention OK on {world_size} ranks ({world_size * N} tokens in the "
              f"zigzag layout; {H} query and {HKV} key/value heads, then {heads} and {kv}): "
              "outputs and dq, dk, dv match attention on one device under the "
              "document-and-causal mask, one document and packed ones. Rank 0 sent "
              f"{fwd:,.0f} bytes forward and {bwd:,.0f} backward with packed documents; an "
              f"all-gather of K and V, (W - 1)/W of 2 B T H_kv d float64s, is {formula:,.0f}.")
