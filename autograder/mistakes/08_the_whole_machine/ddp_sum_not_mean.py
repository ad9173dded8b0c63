"""finish() writes the sum over the group back, not the mean."""

CAUGHT_BY = {"check_overlapped_ddp": "summed over the group, not averaged"}

_init = OverlappedDDP.__init__  # noqa: F821


def __init__(self, params, *, group=None, bucket_bytes):
    _init(self, params, group=group, bucket_bytes=bucket_bytes)
    self.size = 1  # the mistake: nothing to divide by


OverlappedDDP.__init__ = __init__  # noqa: F821
