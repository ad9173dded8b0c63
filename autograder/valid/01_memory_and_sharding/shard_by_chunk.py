"""Shards cut with torch.chunk and cloned, the mean taken before the reduce-scatter
instead of after it (division is linear: the same numbers up to rounding)."""

PASSES = ["check_flat_shards"]


def take_shard(flat, rank, t):
    return flat.chunk(t)[rank].clone()


def reduce_scatter_flat(grad):
    t = dist.get_world_size()  # noqa: F821
    parts = [(part / t).contiguous() for part in grad.chunk(t)]
    out = torch.empty_like(parts[0])  # noqa: F821
    dist.reduce_scatter(out, parts)  # noqa: F821
    return out
