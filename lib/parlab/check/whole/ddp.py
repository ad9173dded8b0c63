r"""Module 08, exercise 1: `OverlappedDDP`, the bucketed DP all-reduce overlapped with backward.

`OverlappedDDP(params, *, group=None, bucket_bytes)` with `no_sync()` and `finish()` runs on
every rank of `world_size` (2; 3, and 4 ranks in two DP groups of 2, in the hidden test) on a
stack of Linear layers (width 12, so a layer is 624 bytes and `bucket_bytes` = 1000 cuts
every second layer; the hidden test's 600 cuts every layer: 6 buckets, not 3) with one
parameter that gets no gradient (a layer the forward never uses).
Two steps, each of 2 micro-batches, the first inside `no_sync()`. Compared with, all computed
here:

- the gradients of the same model on the whole batch in one process (each rank builds it):
  after `finish()`, every gradient must equal them (float32, rtol 1e-5); the unused
  parameter's must be zeros;
- the calls the tracer (`parlab.comm`) saw: none inside `no_sync()`; during the last
  backward at least one all-reduce, started with `async_op=True` before backward returned
  (overlap); in all, one all-reduce per bucket, of the bucket sizes that cutting the
  parameters, last first, into runs of at least `bucket_bytes` gives, in that order, the same
  on every rank of a group; and over `group`, not the whole world.

Wrong gradients are matched against the usual wrong answers (a sum instead of a mean, no
sync, the earlier micro-batch lost, the whole world instead of `group`) to name the mistake.
"""

from __future__ import annotations

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
from parlab.launch import device

WIDTH, LAYERS, ROWS, MICRO = 12, 5, 12, 2  # 12 rows split over 2, 3 or 2 x 2 ranks
BUCKET_BYTES = 1000  # a Linear(12, 12) holds 624 bytes: buckets of two layers (weight+bias)
SEED = 808
WHOLE = "the whole world"
FIXED_BUCKET = ("the buckets were cut at {fixed} bytes whatever bucket_bytes says: close a bucket "
                "once it holds at least the bucket_bytes given to __init__ (here {given}), not "
                "a number written in")
NO_SYNC = ("inside no_sync() the backward must only accumulate: the hooks return without "
           "starting anything, and the backward after it (outside) starts the buckets once, "
           "for the sums of every micro-batch")
OVERLAP = ("no all-reduce started while the last backward ran, so nothing overlapped: start a "
           "bucket's all-reduce from a gradient hook (p.register_post_accumulate_grad_hook) as "
           "soon as its last parameter's gradient is accumulated, with async_op=True, and only "
           "wait for the handles in finish()")
BLOCKING = ("the all-reduces started during backward were blocking (async_op=False): backward "
            "then stops until the bytes arrive, and nothing overlaps; pass async_op=True, keep "
            "the handle and wait() for it in finish()")
HINTS = {
    "sum": "the gradients were summed over the group, not averaged: divide by its size",
    "local": ("the gradients are this rank's own, not the group's mean: every bucket must be "
              "all-reduced and the mean written back into each parameter's .grad in finish()"),
    "last": ("only the last micro-batch's gradients arrived: the hooks inside no_sync() must "
             "leave .grad alone (autograd accumulates into it), and a bucket must flatten "
             "p.grad after the last backward, not a gradient captured earlier"),
    "world": ("the mean is over the whole world, not over `group`: pass group=self.group to "
              "every all_reduce, and divide by dist.get_world_size(group)"),
    "scale": ("the gradients are off by a constant factor {c:.4g}: divide the sum by the "
              "group's size, dist.get_world_size(group) (here {d}), never by a number written "
              "in"),
    "early": ("some buckets left before all their gradients were accumulated (a tensor hook "
              "sees the gradient before it is added to .grad, or the bucket started at its "
              "first parameter): count each bucket's pending parameters and start it when the "
              "count reaches 0, from register_post_accumulate_grad_hook"),
}


class _Net(nn.Module):
    """LAYERS Linear+Tanh layers; `unused` is registered first (its bucket is the last) and
    never called, so its parameters get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.unused = nn.Linear(WIDTH, 3)
        self.layers = nn.Sequential(*[m for _ in range(LAYERS)
                                      for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def expected_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[int]:
    """Bytes of each bucket: the parameters last first, cut once a run reaches bucket_bytes."""
    sizes, run = [], 0
    for p in reversed(params):
        run += p.numel() * p.element_size()
        if run >= bucket_bytes:
            sizes.append(run)
            run = 0
    return sizes + ([run] if run else [])


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, WIDTH, generator=g)


def _grads(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
           ) -> list[torch.Tensor]:
    """Gradients of the mean loss over `batches`' rows, each batch weighted 1/len(batches)."""
    model.zero_grad(set_to_none=True)
    for x, y in batches:
        (nn.functional.mse_loss(model(x), y) / len(batches)).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


def _candidates(step: int, coord: int, d: int) -> dict[str, list[torch.Tensor]]:
    """The right gradients and the usual wrong ones, for this rank (DP coordinate `coord`)."""
    x, y = _data(step)
    n = ROWS // d
    mine = x[coord * n:(coord + 1) * n].chunk(MICRO), y[coord * n:(coord + 1) * n].chunk(MICRO)
    ref = _Net()
    right = _grads(ref, [(x, y)])
    out = {"right": right, "sum": [g * d for g in right],
           "local": _grads(ref, list(zip(*mine, strict=True)))}
    lasts = [_grads(ref, [(x[k * n:(k + 1) * n].chunk(MICRO)[-1],
                           y[k * n:(k + 1) * n].chunk(MICRO)[-1])]) for k in range(d)]
    out["last"] = [sum(gs) / (MICRO * d) for gs in zip(*lasts, strict=True)]
    return out


def _factor(got: list[torch.Tensor], right: list[torch.Tensor]) -> float | None:
    """c when got == c * right for every tensor (a wrong divisor), else None."""
    num = sum(float((g * r).sum()) for g, r in zip(got, right, strict=True))
    den = sum(float((r * r).sum()) for r in right)
    c = num / den if den else 0.0
    ok = c != 0 and _close(got, [r * c for r in right])
    return c if ok and abs(c - 1) > 1e-3 else None


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(u, v, rtol=1e-5, atol=1e-6) for u, v in zip(a, b, strict=True))


def _step(ddp: Any, model: nn.Module, log: CallLog, step: int, coord: int, d: int) -> dict:
    x, y = (t.to(device()) for t in _data(step))
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
    refuse_in_rank(ddp_references(), "parlab.dp.ddp.BucketedDDP (or PyTorch's "
                   "DistributedDataParallel)")
    log = CallLog()
    with log.watch():
        ddp = call_learner("OverlappedDDP(model.parameters(), group=..., bucket_bytes=...)",
                           lambda: cls(model.parameters(), group=group,
                                       bucket_bytes=bucket_bytes))
        steps = []
        for step in range(2):
            start = len(log.calls)
            steps.append({**_step(ddp, model, log, step, coord, d),
                          "calls": log.calls[start:]})
    params = list(model.parameters())
    expect = expected_buckets(params, bucket_bytes)
    return {"steps": steps, "cands": [_candidates(s, coord, d) for s in range(2)],
            "expect": expect, "bucket_bytes": bucket_bytes,
            "default": expected_buckets(params, BUCKET_BYTES), "members": members,
            "world": world, "names":
            [n for n, _ in model.named_parameters()]}


def _judge_grads(rank: int, r: dict, step: int) -> None:
    got, cands = r["steps"][step]["got"], r["cands"][step]
    names, d = r["names"], len(r["members"])
    for name, g in zip(names, got, strict=True):
        if g is None:
            fail(f"after finish() (step {step}), {name} has no gradient", rank=rank,
                 hint="a parameter that got no gradient in backward (here: a layer the "
                      "forward never used; in a real model, an expert no token chose) must "
                      "still be reduced, as zeros, so every rank sends the same buckets: "
                      "finish() starts every bucket that did not leave during backward")
    if _close(got, cands["right"]):
        return
    story = next((HINTS[k] for k in ("sum", "local", "last") if _close(got, cands[k])), None)
    c = _factor(got, cands["right"])
    if story is None:
        story = HINTS["scale"].format(c=c, d=d) if c is not None else HINTS["early"]
    worst = max(range(len(got)), key=lambda i: float((got[i] - cands["right"][i]).abs().max()))
    diff = float((got[worst] - cands["right"][worst]).abs().max())
    fail(f"after finish() (step {step}), the gradient of {names[worst]} differs from the "
         f"whole batch's on one device by up to {diff:.3g} (rtol 1e-5)", rank=rank, hint=story)


def _judge_sync(rank: int, r: dict, step: int) -> None:
    """Nothing inside no_sync, some all-reduce, over the group: before the gradients."""
    calls = r["steps"][step]["calls"]
    inside = [c for c in calls if c.phase == "no_sync"]
    if inside:
        fail(f"step {step}: {len(inside)} communication call(s) ({inside[0].kind}) ran inside "
             "no_sync()", rank=rank, hint=NO_SYNC)
    reduces = [c for c in calls if c.kind == "all_reduce"]
    if not reduces and step == 1 and any(c.kind == "all_reduce"
                                         for c in r["steps"][0]["calls"]):
        fail("step 0 sent its buckets, step 1 (the next backward and finish) sent none",
             rank=rank, hint="finish() must leave the buckets ready for the next step: reset "
             "each bucket's count of pending gradients and forget the handles it waited for")
    if not reduces:
        fail(f"step {step}: no dist.all_reduce was called", rank=rank,
             hint="each bucket is averaged with one dist.all_reduce(flat, group=..., "
                  "async_op=True) of its flattened gradients")
    if any(c.group != tuple(r["members"]) for c in reduces):
        fail(f"step {step}: an all-reduce ran over ranks {list(reduces[0].group)}, not over "
             f"the DP group {r['members']}", rank=rank, hint=HINTS["world"])


def _judge_overlap(rank: int, r: dict, step: int) -> None:
    """All-reduces started during backward, asynchronously, one per bucket, in order."""
    s, expect = r["steps"][step], r["expect"]
    reduces = [c for c in s["calls"] if c.kind == "all_reduce"]
    during = [c for c in reduces if c.phase == "backward"]
    if not during or during[0].start >= s["backward_end"]:
        fail(f"step {step}: the first all-reduce started after the last backward had ended",
             rank=rank, hint=OVERLAP)
    if not all(c.async_op for c in during):
        fail(f"step {step}: {sum(not c.async_op for c in during)} all-reduce(s) during "
             "backward were blocking", rank=rank, hint=BLOCKING)
    sizes = [c.nbytes for c in reduces]
    if sizes != expect:
        per_param = len(sizes) == len(r["names"])
        given = r["bucket_bytes"]
        fixed = given != BUCKET_BYTES and sizes == r["default"]
        fail(f"step {step}: the all-reduces carried {sizes} bytes, in this order; buckets of "
             f"at least bucket_bytes={given} over the parameters, last first, give "
             f"{expect}", rank=rank,
             hint=FIXED_BUCKET.format(fixed=BUCKET_BYTES, given=given) if fixed else
                  "one all-reduce per parameter pays the latency alpha every time: bucket "
                  "them" if per_param else
                  "walk the parameters in reverse (the order backward produces gradients), "
                  "close a bucket once it holds at least bucket_bytes, and start the buckets "
                  "in that order (bucket 0 first), each once")


@exercise(KEY_DDP)
def check_overlapped_ddp(cls: type, *, world_size: int = 2, groups: list[list[int]] | None = None,
                         bucket_bytes: int = BUCKET_BYTES, timeout: float = CHECK_TIMEOUT_S,
                         quiet: bool = False) -> dict:
    """OverlappedDDP on `world_size` ranks (in `groups`, or one group of all), built with
    `bucket_bytes`: gradients equal to one device's, no call inside no_sync, buckets started
    during backward, in order, one all-reduce per bucket that size gives."""
    not_reference(cls, name="OverlappedDDP", modules=("parlab.dp", "torch.nn.parallel"))
    results = run_checked(_worker, world_size, cls, groups, bucket_bytes, what="OverlappedDDP",
                          timeout=timeout, hang_hint=HANG)
    for rank, r in enumerate(results):
        for step in range(2):
            _judge_sync(rank, r, step)
            _judge_grads(rank, r, step)
            _judge_overlap(rank, r, step)
    r0 = results[0]["steps"][1]
    during = [c for c in r0["calls"] if c.kind == "all_reduce" and c.phase == "backward"]
    summary = {"buckets": len(results[0]["expect"]), "during_backward": len(during),
               "lead_s": r0["backward_end"] - during[0].start}
    if not quiet:
        print(f"OverlappedDDP OK on {world_size} ranks: gradients equal to one device's; "
              f"nothing sent inside no_sync(); {summary['during_backward']} of "
              f"{summary['buckets']} buckets left during the last backward, the first "
              f"{summary['lead_s'] * 1e3:.2f} ms before it ended")
    return summary

