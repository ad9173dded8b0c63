"""Mistake: exercise 6 expands K and V by 2, the grouping of the check's first case.

Replaces the exercise-6 answer's `allgather_attention`: the gathered keys and values are
repeated 2 times, the 4 query heads over 2 key/value heads of the first case, instead of
q.shape[1] // k.shape[1]. Right while H = 2 H_kv; with 6 query heads over 2 key/value heads
the shapes no longer fit, and the check says to read H and H_kv from the tensors.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "with H and H_kv read from q.shape[1] and k.shape[1]",
}


def allgather_attention(q, k, v, pos, doc):
    rank = dist.get_rank()
    keys, values = GatherKV.apply(k, pos), GatherKV.apply(v, pos)  # noqa: F821
    keys = keys.repeat_interleave(2, dim=1)  # wrong: q.shape[1] // k.shape[1]
    values = values.repeat_interleave(2, dim=1)
    q_pos = pos[rank]
    k_pos = torch.arange(pos.numel(), device=q.device)
    mask = (doc[k_pos][None, :] == doc[q_pos][:, None]) & (k_pos[None, :] <= q_pos[:, None])
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
