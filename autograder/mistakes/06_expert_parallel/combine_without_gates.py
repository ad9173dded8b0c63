"""Mistake: the combine adds up the expert outputs without weighting them by their gates.

The routing decided which experts run, but their outputs must still be mixed with the
softmax probabilities: y_i = x_i + sum_j g_ij FFN_e_ij(x_i). Without the gates the router gets
no gradient from the task loss either.

Replaces ep_moe (exercise 3).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe": "combined without the gate weights"}


def ep_moe(x, gates, experts, shard):
    t = dist.get_world_size()
    n, k = experts.shape
    per_rank = shard.num_experts // t
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=shard.num_experts)
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
    return x + mine.view(n, k, -1).sum(dim=1)  # wrong: no gates
