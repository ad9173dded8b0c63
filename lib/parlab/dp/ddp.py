r"""Data parallelism as practitioners run it: gradient buckets all-reduced during backward.

    ddp = BucketedDDP(model.parameters(), group=dp_group, bucket_bytes=2**20)
    with ddp.no_sync():
        loss_0.backward()          # micro-batches that only accumulate: no communication
    loss_1.backward()              # the last one: each bucket's all-reduce starts as it fills
    ddp.finish()                   # wait for them; every .grad is now the mean over the group
    optimizer.step()

Why buckets, why during backward. Backward produces gradients from the last layer to the
first. A bucket is a few consecutive parameters (in that reverse order) whose gradients add up
to `bucket_bytes`; once the last of them is ready, a hook flattens the bucket and starts an
asynchronous all-reduce, and backward goes on computing the earlier layers' gradients while
the bytes travel. Under the α–β model one all-reduce of n bytes on d ranks costs
$\alpha + 2\frac{d-1}{d}\frac{n}{\beta}$: one bucket per parameter pays α hundreds of times,
one bucket for the whole model cannot start before backward ends. Buckets of a few MB pay α
a few times and hide all but the last bucket's transfer behind compute (PyTorch DDP's default
is 25 MiB; Li et al., "PyTorch Distributed", arXiv:2006.15704).

Buckets leave in order (bucket 0, the last layers, first), as PyTorch's reducer does: a bucket
that is ready waits for the ones before it. Every rank then makes the same all-reduces in the
same order even when its backward visits parameters in another order (a data-dependent graph:
an expert that got no rows on one rank), so no all-reduce meets the wrong partner.

Gradient accumulation: inside `no_sync()` the hooks do nothing, so gradients only add up
locally; the backward after it (outside) all-reduces the accumulated sums once. A gradient that
arrives for a bucket whose all-reduce has already started (a second backward outside
`no_sync()`) raises RuntimeError: the bucket left without it.

Timing (`.stats`): `backward_s` is the time from the first hook to the last, `wait_s` the time
`finish` spent blocked on transfers that backward did not hide (up to the moment the GPU has
done them: under NCCL `wait()` returns once the wait is queued), and `first_start` /
`backward_end` (perf_counter) show whether the first bucket left before backward was over.
In a profiler trace (`parlab.timeline`) each start is a range "allreduce bucket k" and each
wait in `finish` a range "wait bucket k".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.profiler import record_function

from parlab.launch.devices import synchronize

__all__ = ["BucketedDDP", "Bucket", "DDPStats", "make_buckets"]


@dataclass
class Bucket:
    """Consecutive parameters (in backward order) reduced as one flat tensor."""

    params: list[nn.Parameter]
    pending: int = 0  # gradients not yet ready in this backward
    flat: Tensor | None = None
    work: Any = None  # the async all-reduce's handle
    started: float | None = None  # perf_counter when its all-reduce was started
    index: int = 0  # its place in the order buckets leave in

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


@dataclass
class DDPStats:
    """When the buckets left and how long the step waited for them (perf_counter seconds)."""

    starts: list[float] = field(default_factory=list)  # one per bucket, in start order
    first_hook: float | None = None
    backward_end: float | None = None  # the last gradient hook
    wait_s: float = 0.0  # time finish() spent blocked
    in_hooks: int = 0  # buckets started from a hook during backward (the rest in finish)

    @property
    def first_start(self) -> float | None:
        return min(self.starts) if self.starts else None

    @property
    def backward_s(self) -> float:
        if self.first_hook is None or self.backward_end is None:
            return 0.0
        return self.backward_end - self.first_hook


def make_buckets(params: Iterable[nn.Parameter], bucket_bytes: int) -> list[Bucket]:
    """Parameters that need gradients, last first (the order backward produces them), cut
    into buckets of at least `bucket_bytes` (the last bucket may be smaller)."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
    buckets: list[Bucket] = []
    current: list[nn.Parameter] = []
    size = 0
    for p in reversed([p for p in params if p.requires_grad]):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(Bucket(current, index=len(buckets)))
            current, size = [], 0
    if current:
        buckets.append(Bucket(current, index=len(buckets)))
    return buckets


class BucketedDDP:
    """Average gradients over `group`, bucket by bucket, overlapped with backward."""

    def __init__(self, params: Iterable[nn.Parameter], *, group: dist.ProcessGroup | None = None,
                 bucket_bytes: int = 2**20) -> None:
        params = list(params)
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter is listed twice (tied weights?): pass each once")
        self.group, self.buckets = group, make_buckets(params, bucket_bytes)
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.stats = DDPStats()
        self._sync = True
        self._next = 0  # the next bucket to leave (they leave in order)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._handles = [p.register_post_accumulate_grad_hook(self._ready)
                         for b in self.buckets for p in b.params]
        self._reset()

    def _reset(self) -> None:
        self._next = 0
        for b in self.buckets:
            b.pending, b.flat, b.work, b.started = len(b.params), None, None, None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients (no all-reduce)."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _ready(self, p: Tensor) -> None:
        """A gradient is fully accumulated: start its bucket's all-reduce if it was the last
        (and every bucket before it has left)."""
        now = time.perf_counter()
        if not self._sync:
            return
        bucket = self._bucket_of[id(p)]
        if bucket.flat is not None or bucket.pending <= 0:
            raise RuntimeError(
                f"a gradient arrived for bucket {bucket.index} after its all-reduce had "
                "started (or a parameter's gradient was accumulated twice in one synced "
                "backward): run every backward but the last inside no_sync(), and call "
                "finish() once after the last")
        if self.stats.first_hook is None:
            self.stats.first_hook = now
        self.stats.backward_end = now
        bucket.pending -= 1
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self.stats.in_hooks += 1

    def _start(self, bucket: Bucket) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        with record_function(f"allreduce bucket {bucket.index} ({bucket.nbytes / 2**10:.0f} KiB)"):
            bucket.flat = torch.cat([g.reshape(-1) for g in grads])  # (numel of the bucket,)
            bucket.started = time.perf_counter()
            self.stats.starts.append(bucket.started)
            if self.size > 1:
                bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self._next = bucket.index + 1

    def finish(self) -> DDPStats:
        """Wait for every bucket, write the averaged gradients back, return this step's stats.

        A bucket whose parameters did not all get a gradient in this backward (an unused
        layer, an expert that got no rows) leaves here, in order, its missing gradients as
        zeros, so every rank makes the same calls in the same order."""
        waited = time.perf_counter()
        for bucket in self.buckets[self._next:]:
            self._start(bucket)
        for bucket in self.buckets:
            if bucket.work is not None:
                with record_function(f"wait bucket {bucket.index}"):
                    bucket.work.wait()
            assert bucket.flat is not None
            offset = 0
            for p in bucket.params:
                n = p.numel()
                mean = bucket.flat[offset:offset + n].view_as(p) / self.size
                p.grad = mean if p.grad is None else p.grad.copy_(mean)
                offset += n
        synchronize()  # under NCCL wait() only queues the wait: the clock stops when it is done
        self.stats.wait_s = time.perf_counter() - waited
        stats, self.stats = self.stats, DDPStats()
        self._reset()
        return stats

    def discard(self) -> None:
        """Forget a round that was never finished: wait for the all-reduces it started (every
        rank started them) and drop their results; the gradients stay as they are."""
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
        self.stats = DDPStats()
        self._reset()

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for handle in self._handles:
            handle.remove()
