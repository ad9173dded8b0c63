"""The hook starts each bucket with a blocking all-reduce: backward stops until the bytes
arrive, so the buckets "start during backward" and still overlap nothing."""

CAUGHT_BY = {"check_overlapped_ddp": "were blocking"}


class _Done:
    def wait(self):
        pass


def _start(self, i):
    grads = [p.grad if p.grad is not None else torch.zeros_like(p)  # noqa: F821
             for p in self.buckets[i]]
    self.flats[i] = torch.cat([g.reshape(-1) for g in grads])  # noqa: F821
    dist.all_reduce(self.flats[i], group=self.group)  # noqa: F821  the mistake: no async_op
    self.works[i] = _Done()
    self.next = i + 1


OverlappedDDP._start = _start  # noqa: F821
