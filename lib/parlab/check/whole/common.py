r"""What every module-08 check shares: the exercises' keys, the sentences of the hints, the
course's references each exercise must not call, and the tracer of communication calls.

References refused while the learner's code runs (`parlab.check._harness.refuse_in_rank` in the
ranks, `call_learner(refuse=...)` in the kernel):

- exercise 1 (`OverlappedDDP`): `parlab.dp.ddp` (BucketedDDP, make_buckets), PyTorch's
  `DistributedDataParallel`, and `parlab.compose.grads`' syncs built on them;
- exercise 2 (`recompute_forward`, `saved_bytes_formula`): `RecomputeLayer` (its forward and
  helpers), `saved_activation_bytes`, `recompute_flops` and `parlab.costs.activations`;
  `attention_core`, `dropout` and `torch.utils.checkpoint` are allowed, and the text says so;
- exercise 3 (`train_3d`): the composed training of `parlab.compose` (train, train_step,
  setup, finalize_grads) and exercise 1's references; the pieces (grid, stages, schedule
  runner, sum_grads, allreduce_sequence_parallel_grads) are allowed;
- exercise 4 (`memory_per_gpu`, `bytes_per_step`): the planner's cost model, `parlab.plan`;
- exercise 5 (`clip_grad_norm_`): `parlab.compose.clip_grad_norm_` and its `owns`, refused in
  the ranks by `parlab.check.whole.clip` itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

KEY_DDP, KEY_RECOMPUTE, KEY_TRAIN, KEY_PLAN = ("08.overlapped_ddp", "08.recompute",
                                               "08.train_3d", "08.plan")
DDP_NEEDS = {KEY_DDP: "OverlappedDDP (exercise 1)"}

HANG = ("a collective that only some ranks call, or ranks calling different collectives (a "
        "bucket started on one rank and not on another): every rank must make the same calls "
        "in the same order, and finish() must wait for every bucket it started")


def ddp_references() -> list[Any]:
    """What exercise 1 must not use (and exercise 3 must not use instead of exercise 1)."""
    from torch.nn.parallel import DistributedDataParallel

    from parlab.compose import grads
    from parlab.dp import ddp

    return [ddp.BucketedDDP, ddp.make_buckets, DistributedDataParallel, grads.bucketed,
            grads.data_parallel, grads.sync_data_parallel]


@dataclass
class Call:
    """One communication call a rank made, as the check saw it."""

    kind: str
    nbytes: int
    group: tuple[int, ...]
    start: float
    phase: str  # what the check was running: "no_sync", "backward", "finish", ...
    async_op: bool = False
    data: Any = None  # with CallLog(snapshot=True): a copy of the tensor it was given


@dataclass
class CallLog:
    """Every dist.* call this rank makes while `watch()` is open, labelled with `phase`."""

    calls: list[Call] = field(default_factory=list)
    phase: str = "setup"
    snapshot: bool = False  # keep a copy of each all_reduce's tensor, taken before the call

    def of(self, kind: str, phase: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.kind == kind and (phase is None or c.phase == phase)]

    @contextmanager
    def watch(self) -> Iterator[CallLog]:
        """Record through parlab.comm's listeners, and all_reduce's async_op (and, with
        `snapshot`, what its tensor held before the call) through a thin wrapper of
        `dist.all_reduce` (what `dist.all_reduce(...)` in the learner's code calls)."""
        import torch
        import torch.distributed as dist

        from parlab import comm

        def listener(phase: str, event: Any) -> None:
            if phase == "start" and not event.kind.startswith("wait("):
                self.calls.append(Call(event.kind, event.nbytes, tuple(event.group_ranks),
                                       time.perf_counter(), self.phase))

        original = dist.all_reduce

        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            before = len(self.calls)
            tensor = args[0] if args else kwargs.get("tensor")
            data = (tensor.detach().clone() if self.snapshot and isinstance(tensor, torch.Tensor)
                    else None)
            out = original(*args, **kwargs)
            if len(self.calls) > before:  # the listener saw it: note how it was called
                self.calls[before].async_op = bool(kwargs.get(
                    "async_op", args[3] if len(args) > 3 else False))
                self.calls[before].data = data
            return out

        comm.install()
        comm.add_listener(listener)
        dist.all_reduce = all_reduce
        try:
            yield self
        finally:
            dist.all_reduce = original
            comm.remove_listener(listener)
