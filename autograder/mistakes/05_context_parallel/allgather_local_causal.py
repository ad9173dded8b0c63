"""Mistake: the causal mask built from local positions, as if the layout were contiguous.

Replaces exercise 6's `allgather_attention`. Rank r takes its queries for positions
r*n .. (r+1)*n - 1, the contiguous layout's, instead of reading pos[rank]: under zigzag its
tokens sit in chunks r and 2W - 1 - r, so the mask gives early queries late keys and late
queries too few. Wrong on every rank, with one document or several.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "the causal mask compares local indices",
}


def allgather_attention(q, k, v, pos, doc):
    rank, n = dist.get_rank(), q.shape[2]
    keys, values = GatherKV.apply(k, pos), GatherKV.apply(v, pos)  # noqa: F821
    g = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    q_pos = torch.arange(rank * n, (rank + 1) * n, device=q.device)  # not pos[rank]
    k_pos = torch.arange(pos.numel(), device=q.device)
    mask = (doc[k_pos][None, :] == doc[q_pos][:, None]) & (k_pos[None, :] <= q_pos[:, None])
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
