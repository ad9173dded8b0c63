"""build_groups with PyTorch's dist.new_subgroups_by_enumeration, which makes every group of
the list on every rank (collectively, in order) and hands back the one this rank is in."""

PASSES = ["check_build_groups"]


def build_groups(sizes):
    mine = {}
    for axis in sizes:
        ranks = axis_groups(dist.get_world_size(), sizes, axis)  # noqa: F821
        mine[axis], _ = dist.new_subgroups_by_enumeration(ranks)  # noqa: F821
    return mine
