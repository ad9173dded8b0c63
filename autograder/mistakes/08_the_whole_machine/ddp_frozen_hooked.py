"""Mistake: every parameter is bucketed and hooked, frozen ones (requires_grad=False)
included: autograd refuses a hook on a tensor that needs no gradient (and a bucket that waits
for one would never fill during backward).

Replaces OverlappedDDP.__init__ (exercise 1)."""

CAUGHT_BY = {"check_overlapped_ddp": "a frozen parameter (requires_grad=False) gets no gradient"}


def __init__(self, params, *, group=None, bucket_bytes):
    self.group = group
    self.size = dist.get_world_size(group)  # noqa: F821
    self.sync = True
    self.buckets, current, size = [], [], 0
    for p in reversed(list(params)):  # the mistake: frozen parameters too
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
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
