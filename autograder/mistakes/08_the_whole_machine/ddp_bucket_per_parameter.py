"""One all-reduce per parameter: bucket_bytes is ignored."""

CAUGHT_BY = {"check_overlapped_ddp": "one all-reduce per parameter"}

_init = OverlappedDDP.__init__  # noqa: F821


def __init__(self, params, *, group=None, bucket_bytes):
    _init(self, params, group=group, bucket_bytes=1)  # the mistake: every parameter alone


OverlappedDDP.__init__ = __init__  # noqa: F821
