"""Mistake: expert e is looked for on rank e % t (round robin) instead of e // (E / t).

The shard on rank r holds experts r*E/t .. (r+1)*E/t - 1. Sending expert e's tokens to rank
e % t, as local expert e // t, runs them through another expert's weights.

Replaces ep_moe (exercise 3).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe": "experts are placed in blocks"}


def ep_moe(x, gates, experts, shard):
    t = dist.get_world_size()
    n, k = experts.shape
    per_rank = shard.num_experts // t
    flat = experts.flatten()
    key = (flat % t) * per_rank + flat // t  # wrong: round-robin placement
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=shard.num_experts)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    in_splits = counts.view(t, per_rank).sum(dim=1).tolist()
    out_splits = got.view(t, per_rank).sum(dim=1).tolist()
    rows = AllToAll.apply(x[order // k], out_splits, in_splits)  # noqa: F821
    local = torch.repeat_interleave(torch.arange(per_rank).repeat(t), got)
    done = torch.zeros_like(rows)
    for j in range(per_rank):
        sel = (local == j).nonzero().flatten()
        done = done.index_add(0, sel, shard.expert(j, rows[sel]))
    back = AllToAll.apply(done, in_splits, out_splits)  # noqa: F821
    mine = torch.zeros_like(back).index_copy(0, order, back)
    return x + (gates.reshape(-1, 1) * mine).view(n, k, -1).sum(dim=1)
