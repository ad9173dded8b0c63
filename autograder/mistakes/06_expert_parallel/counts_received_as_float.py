"""Mistake: the counts are received into a float32 buffer while int64 counts are sent.

torch.empty(E) is float32; bincount gives int64. all_to_all_single does not convert: gloo
refuses the call ("Invalid usage of tensors with different dtypes") without saying which
buffer is wrong or how to allocate it. The receive buffer must have the sent tensor's dtype:
torch.empty_like(counts). The check names both dtypes before the exchange.

Replaces ep_moe (exercise 3).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ep_moe": "would receive into a torch.float32 tensor"}


def ep_moe(x, gates, experts, shard):
    ep = dist.get_world_size()
    n, k = experts.shape
    per_rank = shard.local
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=shard.num_experts)
    got = torch.empty(shard.num_experts)  # wrong: float32, the counts are int64
    dist.all_to_all_single(got, counts)
    got = got.long()
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
