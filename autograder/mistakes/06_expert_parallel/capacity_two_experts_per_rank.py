"""Mistake: ep_moe_capacity with the experts per rank written in as 2, not shard.local.

Right on every configuration with 2 experts per rank, which were all the visible tests ran; the
visible test's third call has 3 ranks with 3 experts each, where the equal splits of 2c rows
per rank no longer cover the (E c, C) buffer. The check ran the same answer at 2 experts per
rank first, in the same launch, so the hint names the change it fails on.

Replaces ep_moe_capacity (exercise 4); AllToAll, expert_capacity and keep_mask are the
learner's.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

CAUGHT_BY = {
    "check_ep_capacity_three_per_rank": "ran with 2 experts per rank and fails with 3",
}


def ep_moe_capacity(x, gates, experts, shard, capacity):
    ep = dist.get_world_size()
    n, k = experts.shape
    e, c = shard.num_experts, capacity
    keep = keep_mask(experts, e, c)  # noqa: F821
    order = experts.t().flatten()
    onehot = F.one_hot(order, e)
    place = ((onehot.cumsum(dim=0) * onehot).sum(dim=1) - 1).view(k, n).t()
    slot = experts * c + place
    token = torch.arange(n, device=x.device).unsqueeze(1).expand(n, k)
    send = x.new_zeros(e * c, x.shape[1]).index_copy(0, slot[keep], x[token[keep]])
    per_rank = 2  # wrong: shard.local (E / ep)
    splits = [per_rank * c] * ep
    rows = AllToAll.apply(send, splits, splits)  # noqa: F821
    slots = rows.view(ep, per_rank, c, -1)
    done = torch.stack([shard.expert(j, slots[:, j].reshape(ep * c, -1)).view(ep, c, -1)
                        for j in range(per_rank)], dim=1)
    done = done.reshape(ep * per_rank * c, -1)
    back = AllToAll.apply(done, splits, splits)  # noqa: F821
    picked = back[slot.clamp(max=e * c - 1).flatten()].view(n, k, -1)
    return x + ((gates * keep).unsqueeze(-1) * picked).sum(dim=1)
