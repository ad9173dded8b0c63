"""The mean divides by 2, the example's world size written in: right on 2 ranks only."""

CAUGHT_BY = {"check_overlapped_ddp": "off by a constant factor"}
SIZES = {"check_overlapped_ddp": (3,)}

_init = OverlappedDDP.__init__  # noqa: F821


def __init__(self, params, *, group=None, bucket_bytes):
    _init(self, params, group=group, bucket_bytes=bucket_bytes)
    self.size = 2  # the mistake: dist.get_world_size(group) on 2 ranks, by hand


OverlappedDDP.__init__ = __init__  # noqa: F821
