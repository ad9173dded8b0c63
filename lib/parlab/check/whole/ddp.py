r"""Module 08, exercise 1: `OverlappedDDP`, the bucketed DP all-reduce overlapped with backward.

`OverlappedDDP(params, *, group=None, bucket_bytes)` with `no_sync()` and `finish()` runs on
every rank of `world_size` on `_Net`: a frozen input layer (`requires_grad=False`), a trunk,
four parallel branches summed, a head, and a layer the forward never uses, all Linear of
width 12 (624 bytes with their bias). Two steps, each of 2 micro-batches, the first inside
`no_sync()`. Compared with, all computed here:

- the gradients of the same model on the whole batch in one process (computed in the
  kernel): after `finish()`, every gradient must equal them (float32, rtol 1e-5); the unused
  layer's must be zeros, the frozen layer's must stay None;
- the calls the tracer (`parlab.comm`) saw: none inside `no_sync()`; during the last
  backward at least one all-reduce, started with `async_op=True` before backward returned
  (overlap); in all, one all-reduce per bucket, of the bucket sizes that cutting the
  trainable parameters, last first, into runs of at least `bucket_bytes` gives; over
  `group`, not the whole world;
- which bucket each all-reduce carried, read from its tensor (a copy taken before the
  call) against the rank's own gradients (this check's hooks, registered before the
  answer's, copy each `.grad` when it is accumulated): bucket 0 first, then 1, ..., on every
  rank, each started only once all its gradients were accumulated.

What a right answer must not depend on, and how the tests vary it:

- the group: 2 ranks and 3 (visible), 4 ranks in DP groups [[0, 2], [1, 3]] (visible) and
  [[0, 1], [2, 3]] (hidden), the mean over `dist.get_world_size(group)`;
- `bucket_bytes`: 1248 (visible), two layers exactly, so the cap is reached exactly and
  `>` instead of `>=` cuts other buckets; 600 (visible, and hidden on 3 ranks), a bucket per
  layer: 7 buckets, not 4;
- the order gradients become ready: each rank sums the branches in an order of its own
  (`READY`, by DP coordinate), as a data-dependent graph does (an expert that got no rows),
  so backward reaches them in a different order on every rank and in none in the
  parameters' order. Buckets started as they fill leave in different orders on different
  ranks: the k-th all-reduce of one rank then meets another bucket of the same size on its
  peer (gloo and NCCL pair collectives by the order they are called), and the two layers'
  gradients are summed together, silently: torch's collective check compares only shapes,
  and PARLAB_NCCL_RULES checks devices and point-to-point order. The check names it from
  the buckets it identified;
- parameters without a gradient (the unused layer: zeros, sent like any other) and frozen
  ones (`requires_grad=False`: no hook, no bucket, no `.grad`; a hook on one raises, a
  bucket that waits for one never fills during backward);
- the step: two steps on one object (`finish()` must leave it ready for the next).

Wrong gradients are matched against the usual wrong answers (a sum instead of a mean, no
sync, the earlier micro-batch lost, a constant factor) to name the mistake (`ddp_judge`).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parlab.check._compare import fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    exercise,
    not_reference,
    refuse_in_rank,
    run_checked,
)
from parlab.check.whole.common import HANG, KEY_DDP, CallLog, ddp_references
from parlab.check.whole.ddp_judge import FROZEN_HOOK, candidates, judge_order, judge_rank
from parlab.launch import device

WIDTH, BRANCHES, ROWS, MICRO = 12, 4, 12, 2  # 12 rows split over 2, 3 or 2 x 2 ranks
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # a Linear(12, 12) with its bias: 624 bytes
BUCKET_BYTES = 2 * LAYER_BYTES  # 1248: two layers exactly (the cap is hit, not passed)
SEED = 808
READY = ((0, 1, 2, 3), (1, 3, 0, 2), (2, 0, 3, 1))
"""By DP coordinate: the order in which the branches' gradients become ready (backward
reaches first the branch the forward added last). None is the buckets' order (3, 2, 1, 0)."""


class _Net(nn.Module):
    """Registered in this order: `unused` (never called: no gradient; its bucket is the
    last), `frozen` (requires_grad=False, the first op), `trunk`, the branches, `head`."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the caller's random state is left alone
            torch.manual_seed(SEED)
            self.unused = nn.Linear(WIDTH, 3)
            self.frozen = nn.Linear(WIDTH, WIDTH).requires_grad_(False)
            self.trunk = nn.Linear(WIDTH, WIDTH)
            self.branches = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(BRANCHES))
            self.head = nn.Linear(WIDTH, WIDTH)
        self.ready: tuple[int, ...] = READY[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (rows, WIDTH) -> (rows, WIDTH)
        h = torch.tanh(self.trunk(self.frozen(x)))
        out = torch.zeros_like(h)
        for k in reversed(self.ready):  # added last, its backward runs first
            out = out + torch.tanh(self.branches[k](h))
        return self.head(out)


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def expected_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[int]:
    """Bytes of each bucket: the parameters last first, cut once a run reaches bucket_bytes."""
    return [sum(params[i].numel() * params[i].element_size() for i in b)
            for b in bucket_members(params, bucket_bytes)]


def bucket_members(params: list[nn.Parameter], bucket_bytes: int) -> list[list[int]]:
    """Indices (into `params`) of each bucket's parameters, last first."""
    out, run, size = [], [], 0
    for i in reversed(range(len(params))):
        run.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_bytes:
            out.append(run)
            run, size = [], 0
    return out + ([run] if run else [])


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)


def _step(ddp: Any, model: nn.Module, log: CallLog, step: int, coord: int, d: int) -> dict:
    x, y = (t.to(device()) for t in data(step))
    n = ROWS // d
    xs, ys = x[coord * n:(coord + 1) * n].chunk(MICRO), y[coord * n:(coord + 1) * n].chunk(MICRO)
    model.zero_grad(set_to_none=True)
    log.phase = "no_sync"
    for i in range(MICRO - 1):
        def accumulate(i: int = i) -> None:
            with ddp.no_sync():
                (nn.functional.mse_loss(model(xs[i]), ys[i]) / MICRO).backward()
        call_learner(f"step {step}: a backward inside your no_sync()", accumulate)
    log.phase = "backward"
    last = (nn.functional.mse_loss(model(xs[-1]), ys[-1]) / MICRO)
    call_learner(f"step {step}: the last backward (your gradient hooks)", last.backward)
    backward_end = time.perf_counter()
    log.phase = "finish"
    call_learner(f"step {step}: your finish()", ddp.finish)
    log.phase = "after"
    got = [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]
    return {"got": got, "backward_end": backward_end}


def _build(cls: type, model: nn.Module, group: Any, bucket_bytes: int) -> Any:
    """The learner's constructor; a hook registered on a frozen parameter is named."""
    try:
        return cls(model.parameters(), group=group, bucket_bytes=bucket_bytes)
    except RuntimeError as exc:
        if "doesn't require gradient" not in str(exc):
            raise
        fail(f"OverlappedDDP(model.parameters(), ...) raised RuntimeError: {exc}",
             rank=dist.get_rank(), hint=FROZEN_HOOK)


def _worker(cls: type, groups: list[list[int]] | None, bucket_bytes: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    group, members = None, list(range(world))
    if groups is not None:
        made = [dist.new_group(g) for g in groups]
        index = next(i for i, g in enumerate(groups) if rank in g)
        group, members = made[index], groups[index]
    d, coord = len(members), members.index(rank)
    model = _Net().to(device())
    model.ready = READY[coord % len(READY)]
    log = CallLog(snapshot=True)
    seen: dict[str, Any] = {}  # name -> (its .grad when accumulated, calls made before)

    def accumulated(name: str, p: torch.Tensor) -> None:  # registered before the answer's
        if log.phase == "backward" and p.grad is not None:
            seen[name] = (p.grad.detach().clone(), len(log.calls))
    for name, p in trainable(model):
        p.register_post_accumulate_grad_hook(functools.partial(accumulated, name))
    refuse_in_rank(ddp_references(), "parlab.dp.ddp.BucketedDDP (or PyTorch's "
                   "DistributedDataParallel)")
    with log.watch():
        ddp = call_learner("OverlappedDDP(model.parameters(), group=..., bucket_bytes=...)",
                           _build, cls, model, group, bucket_bytes)
        steps = []
        for step in range(2):
            start = len(log.calls)
            seen.clear()
            out = _step(ddp, model, log, step, coord, d)
            steps.append({**out, "calls": log.calls[start:],
                          "seen": {n: (g, at - start) for n, (g, at) in seen.items()}})
    return {"steps": steps, "members": members, "world": world, "coord": coord}


def _shapes() -> dict[str, Any]:
    """What the judges need to know of the model: names, trainable ones, buckets."""
    model = _Net()
    names = [n for n, _ in model.named_parameters()]
    train = trainable(model)
    return {"names": names, "trainable": [n for n, _ in train],
            "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
            "params": [p for _, p in train], "all_params": list(model.parameters())}


@exercise(KEY_DDP)
def check_overlapped_ddp(cls: type, *, world_size: int = 2, groups: list[list[int]] | None = None,
                         bucket_bytes: int = BUCKET_BYTES, timeout: float = CHECK_TIMEOUT_S,
                         quiet: bool = False) -> dict:
    """OverlappedDDP on `world_size` ranks (in `groups`, or one group of all), built with
    `bucket_bytes`: gradients equal to one device's, no call inside no_sync, buckets started
    during backward, in order on every rank although their gradients become ready in another
    order on each, one all-reduce per bucket that size gives."""
    not_reference(cls, name="OverlappedDDP", modules=("parlab.dp", "torch.nn.parallel"))
    results = run_checked(_worker, world_size, cls, groups, bucket_bytes, what="OverlappedDDP",
                          timeout=timeout, hang_hint=HANG)
    model = _shapes()
    params = model["params"]
    model.update(expect=expected_buckets(params, bucket_bytes), bucket_bytes=bucket_bytes,
                 members=bucket_members(params, bucket_bytes),
                 default=expected_buckets(params, BUCKET_BYTES), default_bytes=BUCKET_BYTES,
                 with_frozen=expected_buckets(model["all_params"], bucket_bytes))
    for step in range(2):
        judge_order(results, step, model)
        for rank, r in enumerate(results):
            cands = candidates(_Net, data, step, r["coord"], len(r["members"]), MICRO)
            judge_rank(rank, r, step, model, cands)
    r0 = results[0]["steps"][1]
    during = [c for c in r0["calls"] if c.kind == "all_reduce" and c.phase == "backward"]
    summary = {"buckets": len(model["expect"]), "during_backward": len(during),
               "lead_s": r0["backward_end"] - during[0].start}
    if not quiet:
        print(f"OverlappedDDP OK on {world_size} ranks: gradients equal to one device's; "
              f"nothing sent inside no_sync(); the buckets in order on every rank although "
              f"their gradients became ready in other orders; {summary['during_backward']} of "
              f"{summary['buckets']} buckets left during the last backward, the first "
              f"{summary['lead_s'] * 1e3:.2f} ms before it ended")
    return summary
