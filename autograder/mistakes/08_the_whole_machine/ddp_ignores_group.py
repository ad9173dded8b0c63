"""The all-reduces run over the whole world, not over `group`: right on a world that is one DP
group, wrong as soon as DP is one axis of a bigger grid (here 4 ranks in DP groups of 2)."""

CAUGHT_BY = {"check_overlapped_ddp": "not over the DP group"}
SIZES = {"check_overlapped_ddp": (4,)}


def _start(self, i):
    grads = [p.grad if p.grad is not None else torch.zeros_like(p)  # noqa: F821
             for p in self.buckets[i]]
    self.flats[i] = torch.cat([g.reshape(-1) for g in grads])  # noqa: F821
    self.works[i] = dist.all_reduce(self.flats[i], async_op=True)  # noqa: F821  no group=
    self.next = i + 1


OverlappedDDP._start = _start  # noqa: F821
