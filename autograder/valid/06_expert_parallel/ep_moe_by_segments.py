"""ep_moe another way: the token copies sorted by a loop over the experts (each expert's
copies in token order) instead of a stable argsort; the counts exchanged by the list form
dist.all_to_all with equal parts (E_l counts to each rank); the received rows cut with
torch.split into (source rank, local expert) segments, each run through its expert and joined
with torch.cat; the combined rows put back in token order by index_add."""

PASSES = ["check_ep_moe"]


def ep_moe(x, gates, experts, shard):
    ep, e_l = dist.get_world_size(), shard.local  # noqa: F821
    n, k = experts.shape
    flat = experts.reshape(-1)  # (N k,): token i's choice j at i * k + j
    order = torch.cat([(flat == e).nonzero().reshape(-1)  # noqa: F821
                       for e in range(shard.num_experts)])  # copies grouped by expert
    counts = torch.bincount(flat, minlength=shard.num_experts)  # noqa: F821  (E,)
    got = [torch.empty_like(part) for part in counts.split(e_l)]  # noqa: F821
    dist.all_to_all(got, [part.contiguous() for part in counts.split(e_l)])  # noqa: F821
    got = torch.stack(got)  # noqa: F821  (ep, E_l): rows from rank q for my expert j
    in_splits = counts.view(ep, e_l).sum(dim=1).tolist()
    out_splits = got.sum(dim=1).tolist()
    rows = AllToAll.apply(x[order // k], out_splits, in_splits)  # noqa: F821  dispatch
    segments = rows.split(got.reshape(-1).tolist())  # (source, local expert), in that order
    done = torch.cat([shard.expert(i % e_l, seg) for i, seg in enumerate(segments)])  # noqa: F821
    back = AllToAll.apply(done, in_splits, out_splits)  # noqa: F821  combine, sorted order
    weighted = gates.reshape(-1, 1)[order] * back  # (N k, C): each copy times its gate
    return x.index_add(0, order // k, weighted)
