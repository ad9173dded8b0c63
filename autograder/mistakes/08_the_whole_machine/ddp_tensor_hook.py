"""The buckets are driven by p.register_hook, which fires when a gradient is computed and
before autograd adds it to .grad: each bucket is flattened from the .grad of before."""

CAUGHT_BY = {"check_overlapped_ddp": "left before all their gradients were accumulated"}

_base = OverlappedDDP  # noqa: F821


class OverlappedDDP(_base):
    def __init__(self, params, *, group=None, bucket_bytes):
        self.group, self.size, self.sync = group, dist.get_world_size(group), True  # noqa: F821
        self.buckets, current, size = [], [], 0
        for p in reversed([p for p in params if p.requires_grad]):
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
                p.register_hook(lambda grad, p=p: self._ready(p))  # the mistake
        self._reset()
