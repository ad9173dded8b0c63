"""moe_groups from each rank's coordinates, computed by division and remainder (no tensor
view), with PyTorch's dist.new_subgroups_by_enumeration; reduce_moe_grads as one flat bucket
per group, the expert gradients pre-divided before the all-reduce."""

PASSES = ["check_moe_groups", "check_moe_grads"]


def _coords(rank, shape):
    out = []
    for size in reversed(shape):
        out.append(rank % size)
        rank //= size
    return out[::-1]  # (dp, pp, ep, cp, tp)


def moe_groups(sizes):
    world = dist.get_world_size()  # noqa: F821
    shape = [sizes.get(a, 1) for a in ("dp", "pp", "ep", "cp", "tp")]
    mine = {}
    for name, fixed in (("dense", (1, 4)), ("expert", (1, 2, 4))):
        lines = {}
        for r in range(world):
            key = tuple(_coords(r, shape)[i] for i in fixed)
            lines.setdefault(key, []).append(r)
        mine[name], _ = dist.new_subgroups_by_enumeration(list(lines.values()))  # noqa: F821
    return mine


def reduce_moe_grads(dense, experts, groups):
    n = dist.get_world_size(groups["dense"])  # noqa: F821
    for params, group in ((dense, groups["dense"]), (experts, groups["expert"])):
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # noqa: F821
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads]) / n  # noqa: F821
        dist.all_reduce(flat, group=group)  # noqa: F821
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
