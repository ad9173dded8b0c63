"""The FSDP helpers with the collectives' tensor forms, which the exercise allows: the shard
cut by narrow and cloned, the gather by all_gather_into_tensor into a (P,) buffer, the
reduce-scatter by reduce_scatter_tensor on the whole (P,) gradient, divided afterwards."""

PASSES = ["check_flat_shards", "check_fsdp_layer"]


def take_shard(flat, rank, t):
    n = flat.numel() // t
    return flat.narrow(0, rank * n, n).clone()


def all_gather_flat(shard):
    out = shard.new_empty(shard.numel() * dist.get_world_size())  # noqa: F821
    dist.all_gather_into_tensor(out, shard.contiguous())  # noqa: F821
    return out


def reduce_scatter_flat(grad):
    t = dist.get_world_size()  # noqa: F821
    out = grad.new_empty(grad.numel() // t)
    dist.reduce_scatter_tensor(out, grad.contiguous())  # noqa: F821
    return out.div_(t)
