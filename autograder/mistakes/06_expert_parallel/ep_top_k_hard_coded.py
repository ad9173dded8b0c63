"""Mistake: ep_moe with k written in as the visible test's 2 instead of experts.shape[1].

Right whenever each token picks 2 experts, as in the visible test and the notebook's example;
the hidden test routes each token to 3 experts, where the rows sent (order // 2) and the final
view (n, 2, C) no longer fit the (N, 3) routing.

Replaces ep_moe (exercise 3); AllToAll is the learner's.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe_top_k": "take k from the routing"}


def ep_moe(x, gates, experts, shard):
    ep = dist.get_world_size()
    n, k = experts.shape[0], 2  # wrong: n, k = experts.shape
    per_rank = shard.local
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    send = x[order // k]
    counts = torch.bincount(flat, minlength=shard.num_experts)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    in_splits = counts.view(ep, per_rank).sum(dim=1).tolist()
    out_splits = got.view(ep, per_rank).sum(dim=1).tolist()
    rows = AllToAll.apply(send, out_splits, in_splits)  # noqa: F821
    ids = torch.arange(per_rank, device=x.device).repeat(ep)
    local = torch.repeat_interleave(ids, got)
    done = torch.zeros_like(rows)
    for j in range(per_rank):
        sel = (local == j).nonzero().flatten()
        done = done.index_add(0, sel, shard.expert(j, rows[sel]))
    back = AllToAll.apply(done, in_splits, out_splits)  # noqa: F821
    mine = torch.zeros_like(back).index_copy(0, order, back)
    return x + (gates.reshape(-1, 1) * mine).view(n, k, -1).sum(dim=1)
