r"""All-gather context parallelism, Llama 3's scheme (Dubey et al., "The Llama 3 Herd of Models",
arXiv:2407.21783, 2024, section 3.3.2 on context parallelism).

c ranks share a sequence of T tokens, load-balanced as Llama 3 does: the sequence is cut into
2c chunks and rank r holds chunks r and 2c - 1 - r (the zigzag layout of `parlab.cp.layout`),
n = T/c tokens of q, k and v. Instead of passing key/value blocks round a ring, every rank
all-gathers K and V, then computes attention for its own n query rows against all T keys:

    gather_from_context_parallel_region   (B, H_kv, n, D) on each rank -> (B, H_kv, T, D),
                                          every rank's tokens, in position order
                                          forward: all-gather; backward: reduce-scatter

The mask is built from global positions and, for packed sequences, document ids: query i
(position $p_i$, document $d_{p_i}$) sees key j when

$$M_{ij} = [\,d_{p_j} = d_{p_i}\,] \wedge [\,p_j \le p_i\,],$$

which any single-device kernel takes as an explicit boolean mask: one reason Llama 3 chose the
all-gather (a ring must cut such a mask into per-step blocks). The other: under grouped-query
attention K and V carry $H_{kv}$ heads, few against the H of q (8 of 128 in Llama 3 405B), so
the all-gather is small beside the $O(T^2)$ attention it feeds, although it is exposed.

Backward. Every rank's queries read every key, so the gradient of key j is a sum over ranks:
rank r holds the terms of its own queries for all T keys. Summing them and handing each rank
the rows of its own tokens is a reduce-scatter, the all-gather's adjoint; without it dK and dV
would keep only the terms of the owner's own queries.

Bytes per rank and layer (`parlab.cp.compare.allgather_bytes_per_layer`): the all-gather of K
and V sends $\frac{c-1}{c}\,2bTh_{kv}\,d$, the reduce-scatter of dK, dV the same. Memory: every
rank holds the whole sequence's K and V, c times its own share
(`parlab.cp.compare.kv_bytes_held`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from parlab.tp.mappings import gather_from_sequence_parallel_region

__all__ = ["document_ids", "document_mask", "gather_from_context_parallel_region",
           "allgather_attention"]


def document_ids(lengths: Sequence[int], *, device: Any = None) -> Tensor:
    """(T,) int64: the document index of every position of a sequence packed from documents of
    `lengths` tokens, in order (T = sum of lengths)."""
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"document lengths must be positive, got {list(lengths)}")
    sizes = torch.tensor([int(n) for n in lengths], device=device)
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes)


def document_mask(q_pos: Tensor, k_pos: Tensor, doc: Tensor) -> Tensor:
    """(nq, nk) bool, True where the query at global position q_pos[i] may attend to the key at
    k_pos[j]: the same document (doc indexed by position) and not later."""
    same = doc[q_pos][:, None] == doc[k_pos][None, :]  # (nq, nk)
    return same & (k_pos[None, :] <= q_pos[:, None])


def _order(pos: Tensor) -> Tensor:
    """(T,) indices into the rank-order gather (rank 0's tokens, then rank 1's, ...) that put
    it in position order: entry p is where position p arrived."""
    return torch.argsort(pos.reshape(-1))


def gather_from_context_parallel_region(x: Tensor, pos: Tensor, *, group: Any = None
                                        ) -> Tensor:
    """forward: all-gather, (B, H, n, D) this rank's tokens -> (B, H, T, D) every token in
    position order; backward: reduce-scatter, each rank gets the sum over ranks of its own
    tokens' gradients, in its own order.

    pos (c, n) int64: row r the global positions rank r holds (`parlab.cp.position_table`).
    The exchange is `parlab.tp.gather_from_sequence_parallel_region` (all-gather forward,
    reduce-scatter backward) on the tokens-first view; the reordering is a gather of rows,
    whose backward scatters each gradient row back to where its token arrived."""
    whole = gather_from_sequence_parallel_region(x.transpose(1, 2), group=group)  # (B, T, H, D)
    return whole.index_select(1, _order(pos).to(x.device)).transpose(1, 2)  # position order


def allgather_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, doc: Tensor, *,
                        group: Any = None) -> Tensor:
    """This rank's attention output (B, H, n, D), differentiable (module docstring).

    q (B, H, n, D), k and v (B, H_kv, n, D) with H_kv dividing H, the tokens at this rank's
    positions pos[rank]; pos (c, n) every rank's global positions; doc (T,) the document id of
    every global position. Forward: K and V all-gathered, then the rank's queries against all
    T keys under the document-and-causal mask; backward: autograd, dK and dV reduce-scattered
    to their owners by `gather_from_context_parallel_region`."""
    rank = torch.distributed.get_rank(group) if torch.distributed.is_initialized() else 0
    keys, values = (gather_from_context_parallel_region(x, pos, group=group)
                    for x in (k, v))  # (B, H_kv, T, D) each, position order
    g = q.shape[1] // k.shape[1]  # query heads per key/value head
    keys, values = keys.repeat_interleave(g, 1), values.repeat_interleave(g, 1)
    every = torch.arange(pos.numel(), device=q.device)  # (T,) the gathered keys' positions
    mask = document_mask(pos[rank].to(q.device), every, doc.to(q.device))  # (n, T)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
