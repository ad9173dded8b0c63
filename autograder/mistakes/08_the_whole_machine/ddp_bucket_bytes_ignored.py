"""Mistake: OverlappedDDP cuts its buckets at 1248 bytes, the first visible call's
bucket_bytes, whatever the argument says.

Right for that call (bucket_bytes=1248: 4 buckets); the test cell's call with
bucket_bytes=600 (visible, and hidden on 3 ranks), which cuts after every layer (7 buckets),
gets the same 4 buckets.

Replaces OverlappedDDP.__init__ (exercise 1).
"""

CAUGHT_BY = {"check_overlapped_ddp_600": "whatever bucket_bytes says"}

_init = OverlappedDDP.__init__  # noqa: F821


def __init__(self, params, *, group=None, bucket_bytes):
    _init(self, params, group=group, bucket_bytes=1248)  # the mistake: bucket_bytes ignored


OverlappedDDP.__init__ = __init__  # noqa: F821
