"""Mistake: K and V gathered with a plain dist.all_gather, outside any autograd function.

Replaces exercise 6's `allgather_attention`. The output is right, but the gathered tensors
are new buffers with no autograd graph: the backward reaches q only, and k.grad and v.grad
stay None.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "dist.all_gather fills new tensors that carry no autograd graph",
}


def gather(x, pos):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=2)[:, :, torch.argsort(pos.flatten())]


def allgather_attention(q, k, v, pos, doc):
    keys, values = gather(k, pos), gather(v, pos)
    g = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    q_pos = pos[dist.get_rank()]
    k_pos = torch.arange(pos.numel(), device=q.device)
    mask = (doc[k_pos][None, :] == doc[q_pos][:, None]) & (k_pos[None, :] <= q_pos[:, None])
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
