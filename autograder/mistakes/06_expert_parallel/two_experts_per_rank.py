"""Mistake: the number of experts per rank is written as 2, the size the visible check uses.

A rank holds shard.local = E / ep experts; with 3 experts on each of 3 ranks the counts no
longer split into blocks of 2, and the experts past the second never run. Every size must come
from the shard (shard.local, shard.num_experts) and the group (dist.get_world_size()).

Replaces ep_moe (exercise 3); passed every visible call (2 ranks, 2 experts each) and failed
only a hidden 3 × 3 one; that call is visible now, and runs 2 experts per rank first.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe_three_per_rank": "the experts per rank are shard.local"}


def ep_moe(x, gates, experts, shard):
    ep = dist.get_world_size()
    n, k = experts.shape
    per_rank = 2  # wrong: shard.local (E / ep), which the visible check happens to make 2
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=shard.num_experts)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    in_splits = counts.view(ep, per_rank).sum(dim=1).tolist()
    out_splits = got.view(ep, per_rank).sum(dim=1).tolist()
    rows = AllToAll.apply(x[order // k], out_splits, in_splits)  # noqa: F821
    local = torch.repeat_interleave(torch.arange(per_rank).repeat(ep), got)
    done = torch.zeros_like(rows)
    for j in range(per_rank):
        sel = (local == j).nonzero().flatten()
        done = done.index_add(0, sel, shard.expert(j, rows[sel]))
    back = AllToAll.apply(done, in_splits, out_splits)  # noqa: F821
    mine = torch.zeros_like(back).index_copy(0, order, back)
    return x + (gates.reshape(-1, 1) * mine).view(n, k, -1).sum(dim=1)
