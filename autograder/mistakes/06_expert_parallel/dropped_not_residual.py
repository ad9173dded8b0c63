"""Mistake: only tokens that reached at least one expert keep their residual.

A token dropped by every expert it chose must pass through the layer unchanged (y_i = x_i);
here its row comes out as zeros, as if the token had been deleted from the sequence.

Replaces ep_moe_capacity (exercise 4).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

CAUGHT_BY = {"check_ep_capacity": "must leave the layer unchanged"}


def ep_moe_capacity(x, gates, experts, shard, capacity):
    t = dist.get_world_size()
    n, k = experts.shape
    e, c = shard.num_experts, capacity
    keep = keep_mask(experts, e, c)  # noqa: F821
    onehot = F.one_hot(experts.t().flatten(), e)
    place = ((onehot.cumsum(dim=0) * onehot).sum(dim=1) - 1).view(k, n).t()
    slot = experts * c + place
    token = torch.arange(n).unsqueeze(1).expand(n, k)
    send = x.new_zeros(e * c, x.shape[1]).index_copy(0, slot[keep], x[token[keep]])
    splits = [e // t * c] * t
    rows = AllToAll.apply(send, splits, splits)  # noqa: F821
    per_rank = e // t
    local = torch.arange(per_rank).repeat_interleave(c).repeat(t)
    done = torch.zeros_like(rows)
    for j in range(per_rank):
        sel = (local == j).nonzero().flatten()
        done = done.index_add(0, sel, shard.expert(j, rows[sel]))
    back = AllToAll.apply(done, splits, splits)  # noqa: F821
    picked = back[slot.clamp(max=e * c - 1).flatten()].view(n, k, -1)
    reached = keep.any(dim=1, keepdim=True).to(x.dtype)  # wrong: dropped tokens lose x
    return x * reached + ((gates * keep).unsqueeze(-1) * picked).sum(dim=1)
