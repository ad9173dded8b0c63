"""The links are read off a grid with DP innermost (arange(256).view(t, p, c, d)): the TP
groups then look as if they crossed nodes and DP as if it stayed inside one."""

CAUGHT_BY = {"check_plan_70b": "TP innermost"}

_bytes = bytes_per_step  # noqa: F821


def bytes_per_step(model, cluster, sizes, *, micro_batch, microbatches):
    out = _bytes(model, cluster, sizes, micro_batch=micro_batch, microbatches=microbatches)
    d, t = sizes.get("dp", 1), sizes.get("tp", 1)
    for axis, size in (("tp", t), ("dp", d)):  # the mistake: the order of the grid reversed
        if axis in out:
            out[axis]["link"] = (cluster.intra_name if size <= cluster.gpus_per_node
                                 and axis == "dp" else cluster.inter_name)
    return out
