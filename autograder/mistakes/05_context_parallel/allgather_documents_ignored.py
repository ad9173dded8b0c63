"""Mistake: the mask is causal only; the documents are ignored.

Replaces exercise 6's `allgather_attention`. Right with one document, so the check's first
sequence passes; with packed documents each query also reads the earlier documents' tokens.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "the mask ignores the documents",
}


def allgather_attention(q, k, v, pos, doc):
    keys, values = GatherKV.apply(k, pos), GatherKV.apply(v, pos)  # noqa: F821
    g = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    q_pos = pos[dist.get_rank()]
    k_pos = torch.arange(pos.numel(), device=q.device)
    mask = k_pos[None, :] <= q_pos[:, None]  # no doc[...] == doc[...]
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
