"""Mistake: a bucket closes only once it holds more than bucket_bytes (`>`), not at least
bucket_bytes (`>=`). Right wherever no run of parameters adds up to bucket_bytes exactly; the
visible test's 1248 bytes are two layers exactly, so its buckets come out other sizes.

Replaces OverlappedDDP.__init__ (exercise 1)."""

CAUGHT_BY = {"check_overlapped_ddp": "closed only past it (size > bucket_bytes)"}


def __init__(self, params, *, group=None, bucket_bytes):
    self.group = group
    self.size = dist.get_world_size(group)  # noqa: F821
    self.sync = True
    self.buckets, current, size = [], [], 0
    for p in reversed([p for p in params if p.requires_grad]):
        current.append(p)
        size += p.numel() * p.element_size()
        if size > bucket_bytes:  # the mistake: >= is the rule
            self.buckets.append(current)
            current, size = [], 0
    if current:
        self.buckets.append(current)
    self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
    for bucket in self.buckets:
        for p in bucket:
            p.register_post_accumulate_grad_hook(self._ready)
    self._reset()


OverlappedDDP.__init__ = __init__  # noqa: F821
