"""Mistake: the receive split sizes are taken to be the send split sizes.

A rank knows how many rows it sends to each rank, but not how many it will receive: that
depends on the other ranks' routing. Without exchanging the counts first, output_split_sizes
is a guess, and gloo aborts (or, with luck, silently mixes rows).

Replaces ep_moe (exercise 3).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe": "the split sizes were not exchanged"}


def ep_moe(x, gates, experts, shard):
    t = dist.get_world_size()
    n, k = experts.shape
    per_rank = shard.num_experts // t
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=shard.num_experts)
    in_splits = counts.view(t, per_rank).sum(dim=1).tolist()
    out_splits = in_splits  # wrong: what this rank receives is not what it sends
    rows = AllToAll.apply(x[order // k], out_splits, in_splits)  # noqa: F821
    local = torch.repeat_interleave(torch.arange(per_rank).repeat(t), counts)
    done = torch.zeros_like(rows)
    for j in range(per_rank):
        sel = (local == j).nonzero().flatten()
        done = done.index_add(0, sel, shard.expert(j, rows[sel]))
    back = AllToAll.apply(done, in_splits, out_splits)  # noqa: F821
    mine = torch.zeros_like(back).index_copy(0, order, back)
    return x + (gates.reshape(-1, 1) * mine).view(n, k, -1).sum(dim=1)
