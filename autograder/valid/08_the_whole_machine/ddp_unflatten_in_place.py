"""The buckets flattened with PyTorch's _flatten_dense_tensors, and finish() writing each
mean back into the existing .grad tensors in place (unflatten, divide, copy_) instead of
assigning new ones: what DDP does with its bucket views."""

from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

PASSES = ["check_overlapped_ddp"]

_base = OverlappedDDP  # noqa: F821


class OverlappedDDP(_base):
    def _start(self, i):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p)  # noqa: F821
                 for p in self.buckets[i]]
        self.flats[i] = _flatten_dense_tensors(grads)
        self.works[i] = dist.all_reduce(self.flats[i], group=self.group,  # noqa: F821
                                        async_op=True)
        self.next = i + 1

    def finish(self):
        for i in range(self.next, len(self.buckets)):
            self._start(i)
        for i, bucket in enumerate(self.buckets):
            self.works[i].wait()
            means = _unflatten_dense_tensors(self.flats[i] / self.size, bucket)
            for p, mean in zip(bucket, means, strict=True):
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
        self._reset()
