"""Mistake: K and V gathered in rank order, the mask built as if they were in position order.

Replaces exercise 6's `GatherKV` and `allgather_attention`. `dist.all_gather` returns rank
0's tokens, then rank 1's; under the zigzag layout gathered key j is not at position j, so the
mask lets queries read later keys and hides earlier ones. Right under a contiguous layout,
wrong under zigzag on every rank count.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_allgather": "the gathered keys are in rank order",
}


class GatherKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pos):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=2)  # rank order, never put in position order

    @staticmethod
    def backward(ctx, grad):
        parts = [p.contiguous() for p in grad.chunk(dist.get_world_size(), dim=2)]
        mine = torch.empty_like(parts[0])
        dist.reduce_scatter(mine, parts)
        return mine, None


def allgather_attention(q, k, v, pos, doc):
    keys, values = GatherKV.apply(k, pos), GatherKV.apply(v, pos)
    g = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
    q_pos = pos[dist.get_rank()]
    k_pos = torch.arange(pos.numel(), device=q.device)  # gathered key j taken for position j
    mask = (doc[k_pos][None, :] == doc[q_pos][:, None]) & (k_pos[None, :] <= q_pos[:, None])
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
