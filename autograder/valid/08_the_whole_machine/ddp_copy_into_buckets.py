"""OverlappedDDP as PyTorch's DDP moves gradients: each bucket owns a flat buffer made once
in __init__; the hook copies its parameter's gradient into the bucket's slice as soon as it is
ready (a closure per bucket counts them), and the buffer is all-reduced when the bucket is
complete and every bucket before it has left. finish() copies each mean back into .grad."""

PASSES = ["check_overlapped_ddp"]


class OverlappedDDP:
    def __init__(self, params, *, group=None, bucket_bytes):
        self.group, self.sync = group, True
        trainable = [p for p in params if p.requires_grad][::-1]  # last first
        self.buckets = []
        while trainable:
            bucket, size = [], 0
            while trainable and size < bucket_bytes:
                bucket.append(trainable.pop(0))
                size += bucket[-1].numel() * bucket[-1].element_size()
            self.buckets.append(bucket)
        self.buffers = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype,  # noqa: F821
                                    device=b[0].device) for b in self.buckets]
        self.slices = {}
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.slices[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._hook)
        self._reset()

    def _reset(self):
        self.missing = [set(bucket) for bucket in self.buckets]
        self.handles = []

    def _hook(self, p):
        if not self.sync:
            return
        i, offset = self.slices[p]
        self.buffers[i][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.missing[i].discard(p)
        while len(self.handles) < len(self.buckets) and not self.missing[len(self.handles)]:
            self._launch(len(self.handles))

    def _launch(self, i):
        for p in self.missing[i]:  # no gradient this step: zeros, so every rank sends alike
            _, offset = self.slices[p]
            self.buffers[i][offset:offset + p.numel()].zero_()
        self.missing[i] = set()
        self.handles.append(dist.all_reduce(self.buffers[i], group=self.group,  # noqa: F821
                                            async_op=True))

    @contextlib.contextmanager  # noqa: F821
    def no_sync(self):
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    def finish(self):
        while len(self.handles) < len(self.buckets):
            self._launch(len(self.handles))
        size = dist.get_world_size(self.group)  # noqa: F821
        for i, handle in enumerate(self.handles):
            handle.wait()
            self.buffers[i] /= size
            for p in self.buckets[i]:
                _, offset = self.slices[p]
                mean = self.buffers[i][offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
        self._reset()
