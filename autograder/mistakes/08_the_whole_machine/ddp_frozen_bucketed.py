"""Mistake: frozen parameters (requires_grad=False) are put in the buckets, only the hooks
skip them: the buckets that hold one never fill during backward and leave in finish(), with
zeros in its place, and finish() writes a .grad into the frozen parameters.

Replaces OverlappedDDP.__init__ (exercise 1)."""

CAUGHT_BY = {"check_overlapped_ddp": "(requires_grad=False) has a gradient"}


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
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)
    self._reset()


OverlappedDDP.__init__ = __init__  # noqa: F821
