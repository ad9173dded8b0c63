"""axis_groups by strides, without a tensor: an axis's stride is the product of the sizes
inside it (TP innermost); each group starts at a rank whose coordinate on that axis is 0 and
steps by the stride."""

PASSES = ["check_axis_groups"]


def axis_groups(world_size, sizes, axis):
    order = ["dp", "pp", "ep", "cp", "tp"]
    inner = order[order.index(axis) + 1:]
    stride = 1
    for a in inner:
        stride *= sizes.get(a, 1)
    size = sizes.get(axis, 1)
    starts = [r for r in range(world_size) if (r // stride) % size == 0]
    return [[start + i * stride for i in range(size)] for start in starts]
