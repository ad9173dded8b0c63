"""Mistake: OverlappedDDP cuts its buckets at 1000 bytes, the visible test's bucket_bytes,
whatever the argument says.

Right for the visible test (bucket_bytes=1000: 3 buckets); the hidden test builds it with
bucket_bytes=600, which cuts after every layer (6 buckets), and gets the same 3 buckets.

Replaces OverlappedDDP.__init__ (exercise 1).
"""

CAUGHT_BY = {"check_overlapped_ddp_600": "whatever bucket_bytes says"}

_init = OverlappedDDP.__init__  # noqa: F821


def __init__(self, params, *, group=None, bucket_bytes):
    _init(self, params, group=group, bucket_bytes=1000)  # the mistake: bucket_bytes ignored


OverlappedDDP.__init__ = __init__  # noqa: F821
