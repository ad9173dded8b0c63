r"""The judgements of module 08's exercise 1 (`parlab.check.whole.ddp`): what the ranks of one
step did, read in the kernel, and the likely mistake each wrong outcome establishes.

In this order, for each step: the calls (nothing inside `no_sync()`, some all-reduce, over
the group); which bucket each all-reduce carried and when (`judge_order`: a bucket started
before its gradients were all accumulated, buckets in another order than 0, 1, 2, ... and
what that did to the sums of the ranks); the gradients (`judge_rank`: equal to the whole
batch's on one device, else the wrong answer they equal, if any: a sum, this rank's own, the
last micro-batch, a constant factor; the frozen layer's `.grad` still None); the overlap and
the bucket sizes (started during backward, asynchronously, one per bucket; the sizes that
`>=` gives, with the sizes that `>`, a number written in, a bucket per parameter, or frozen
parameters in the buckets give named).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parlab.check._compare import fail

__all__ = ["FROZEN_HOOK", "candidates", "judge_rank", "judge_order"]

FROZEN = ("a frozen parameter (requires_grad=False) gets no gradient: keep only the parameters "
          "that require gradients ([p for p in params if p.requires_grad]), so it gets no hook, "
          "no place in a bucket (a bucket that waits for it never fills during backward) and no "
          ".grad")
FROZEN_HOOK = ("this check's model has a frozen layer (requires_grad=False), and autograd "
               "refuses a hook on a tensor that needs no gradient: " + FROZEN)
FIXED_BUCKET = ("the buckets were cut at {fixed} bytes whatever bucket_bytes says: close a bucket "
                "once it holds at least the bucket_bytes given to __init__ (here {given}), not "
                "a number written in")
STRICT = ("a bucket closes once it holds at least bucket_bytes (size >= bucket_bytes); yours "
          "closed only past it (size > bucket_bytes): here two layers hold exactly {given} bytes")
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
EARLY = ("some buckets left before all their gradients were accumulated: a tensor hook "
         "(p.register_hook) runs before the gradient is added to .grad, and a bucket must not "
         "start at its first parameter; count each bucket's pending parameters down from "
         "register_post_accumulate_grad_hook and start it when the count reaches 0")
ORDER = ("start the buckets in one order every rank agrees on, bucket 0 first: a complete "
         "bucket waits until every bucket before it has left. The order gradients become "
         "ready differs between ranks: here each rank adds the branches in its own order, as "
         "a mixture of experts does when an expert gets no rows on one rank")
PAIRED = ("nothing noticed: gloo and NCCL pair collectives by the order they are called, and "
          "the sizes match ({n} bytes), which is all torch's collective check compares "
          "(PARLAB_NCCL_RULES checks devices and point-to-point order only)")
HINTS = {
    "sum": "the gradients were summed over the group, not averaged: divide by its size",
    "local": ("the gradients are this rank's own, not the group's mean: either a bucket was "
              "never all-reduced, or its result was not written back into each parameter's "
              ".grad in finish()"),
    "last": ("only the last micro-batch's gradients arrived: the hooks inside no_sync() must "
             "leave .grad alone (autograd accumulates into it), and a bucket must flatten "
             "p.grad after the last backward, not a gradient captured earlier"),
    "world": ("the mean is over the whole world, not over `group`: pass group=self.group to "
              "every all_reduce, and divide by dist.get_world_size(group)"),
    "scale": ("the gradients are off by a constant factor {c:.4g} (that many times the group's "
              "mean): divide the sum by the group's size, dist.get_world_size(group) (here "
              "{d}), and by nothing else"),
    "other": ("the gradients equal none of the usual wrong answers (the sum, this rank's own, "
              "the last micro-batch's, the mean times a constant): what finish() writes into "
              "each .grad must be its bucket's all-reduced sum, divided by the group's size, "
              "taken from the same place in the flat tensor that the gradient was copied to"),
}


def _grads(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
           ) -> list[torch.Tensor]:
    """Gradients of the trainable parameters of the mean loss over `batches`' rows, each batch
    weighted 1/len(batches)."""
    model.zero_grad(set_to_none=True)
    for x, y in batches:
        (nn.functional.mse_loss(model(x), y) / len(batches)).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters() if p.requires_grad]


def candidates(net: Callable[[], nn.Module], data: Callable[[int], Any], step: int, coord: int,
               d: int, micro: int) -> dict[str, list[torch.Tensor]]:
    """The right gradients and the usual wrong ones for DP coordinate `coord` of `d`, computed
    here, in the kernel (one device)."""
    x, y = data(step)
    n = x.shape[0] // d
    mine = x[coord * n:(coord + 1) * n].chunk(micro), y[coord * n:(coord + 1) * n].chunk(micro)
    ref = net()
    right = _grads(ref, [(x, y)])
    out = {"right": right, "sum": [g * d for g in right],
           "local": _grads(ref, list(zip(*mine, strict=True)))}
    lasts = [_grads(ref, [(x[k * n:(k + 1) * n].chunk(micro)[-1],
                           y[k * n:(k + 1) * n].chunk(micro)[-1])]) for k in range(d)]
    out["last"] = [sum(gs) / (micro * d) for gs in zip(*lasts, strict=True)]
    return out


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(u, v, rtol=1e-5, atol=1e-6) for u, v in zip(a, b, strict=True))


def _factor(got: list[torch.Tensor], right: list[torch.Tensor]) -> float | None:
    """c when got == c * right for every tensor (a wrong divisor), else None."""
    num = sum(float((g * r).sum()) for g, r in zip(got, right, strict=True))
    den = sum(float((r * r).sum()) for r in right)
    c = num / den if den else 0.0
    ok = c != 0 and _close(got, [r * c for r in right])
    return c if ok and abs(c - 1) > 1e-3 else None


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


def _launched(r: dict, step: int, model: dict) -> tuple[list[Any], list[int | None]]:
    """This rank's all-reduces of the step (backward and finish) and, for each, the bucket
    its tensor held (its values, as a multiset, equal to the bucket's accumulated gradients,
    or to them divided by the group's size), None where it held none of them."""
    s, d = r["steps"][step], len(r["members"])
    reduces = [c for c in s["calls"] if c.kind == "all_reduce" and c.phase in ("backward",
                                                                               "finish")]
    params, names = model["params"], model["trainable"]
    flats = []
    for members in model["members"]:
        parts = [s["seen"][names[i]][0].reshape(-1) if names[i] in s["seen"]
                 else torch.zeros(params[i].numel()) for i in members]
        flats.append(torch.cat(parts).double().sort().values)
    ids: list[int | None] = []
    for c in reduces:
        v = c.data.reshape(-1).double().sort().values if c.data is not None else None
        ids.append(next((k for k, f in enumerate(flats) if v is not None and f.shape == v.shape
                         and (torch.allclose(v, f, rtol=1e-6, atol=1e-12)
                              or torch.allclose(v * d, f, rtol=1e-6, atol=1e-12))), None))
    return reduces, ids


def _early(rank: int, r: dict, step: int, model: dict, reduces: list, ids: list) -> None:
    """A bucket started during backward before one of its gradients was accumulated."""
    s = r["steps"][step]
    in_order = [c.nbytes for c in reduces] == model["expect"]
    for j, c in enumerate(reduces):
        k = ids[j] if ids[j] is not None else (j if in_order else None)
        if c.phase != "backward" or k is None:
            continue
        at = next(i for i, x in enumerate(s["calls"]) if x is c)  # its place in the step
        late = [model["trainable"][i] for i in model["members"][k]
                if s["seen"].get(model["trainable"][i], (None, at + 1))[1] > at]
        if late:
            fail(f"step {step}: bucket {k}'s all-reduce started during backward before the "
                 f"gradient of {late[0]} had been accumulated into its .grad", rank=rank,
                 hint=EARLY)


def judge_order(results: list[dict], step: int, model: dict) -> None:
    """Every rank's calls first (`_judge_sync`), then which bucket each all-reduce carried:
    started only once complete, in the order 0, 1, 2, ... on every rank."""
    for rank, r in enumerate(results):
        _judge_sync(rank, r, step)
    launched = [_launched(r, step, model) for r in results]
    for rank, r in enumerate(results):
        _early(rank, r, step, model, *launched[rank])
    for rank, r in enumerate(results):
        reduces, ids = launched[rank]
        if None in ids or ids == list(range(len(ids))):
            continue  # not identified (judged by its gradients), or in order
        peers = [q for q in r["members"] if q != rank and None not in launched[q][1]]
        diff = next(((q, i) for q in peers for i, (a, b) in enumerate(
            zip(ids, launched[q][1], strict=False)) if a != b), None)
        if diff is None:
            fail(f"step {step}: this rank started its buckets in the order {ids}, as their "
                 "gradients became ready here, not 0, 1, 2, ...: a rank whose backward runs in "
                 "another order starts them in another, and their all-reduces meet the wrong "
                 "buckets", rank=rank, hint=ORDER)
        q, i = diff
        a, b = ids[i], launched[q][1][i]
        sizes = (reduces[i].nbytes, launched[q][0][i].nbytes)
        what = (PAIRED.format(n=sizes[0]) if sizes[0] == sizes[1] else
                f"tensors of {sizes[0]} and {sizes[1]} bytes in one collective")
        fail(f"step {step}: rank {rank} started its buckets in the order {ids}, rank {q} in "
             f"{launched[q][1]} (each as its gradients became ready), so all-reduce {i} summed "
             f"rank {rank}'s bucket {a} with rank {q}'s bucket {b}: two layers' gradients "
             f"added together; {what}", rank=rank, hint=ORDER)


def judge_rank(rank: int, r: dict, step: int, model: dict,
               cands: dict[str, list[torch.Tensor]]) -> None:
    """The gradients after finish(), then the overlap and the bucket sizes."""
    got_all = dict(zip(model["names"], r["steps"][step]["got"], strict=True))
    for name in model["frozen"]:
        if got_all[name] is not None:
            fail(f"after finish() (step {step}), the frozen parameter {name} "
                 "(requires_grad=False) has a gradient", rank=rank, hint=FROZEN)
    names, d = model["trainable"], len(r["members"])
    got = [got_all[n] for n in names]
    for name, g in zip(names, got, strict=True):
        if g is None:
            fail(f"after finish() (step {step}), {name} has no gradient", rank=rank,
                 hint="a parameter that got no gradient in backward (here: a layer the "
                      "forward never used; in a real model, an expert no token chose) must "
                      "still be reduced, as zeros, so every rank sends the same buckets: "
                      "finish() starts every bucket that did not leave during backward")
    if not _close(got, cands["right"]):
        story = next((HINTS[k] for k in ("sum", "local", "last") if _close(got, cands[k])),
                     None)
        c = _factor(got, cands["right"])
        if story is None:
            story = HINTS["scale"].format(c=c, d=d) if c is not None else HINTS["other"]
        worst = max(range(len(got)),
                    key=lambda i: float((got[i] - cands["right"][i]).abs().max()))
        diff = float((got[worst] - cands["right"][worst]).abs().max())
        fail(f"after finish() (step {step}), the gradient of {names[worst]} differs from the "
             f"whole batch's on one device by up to {diff:.3g} (rtol 1e-5)", rank=rank,
             hint=story)
    _judge_overlap(rank, r, step, model)


def _strict(model: dict) -> list[int]:
    """The bucket sizes `size > bucket_bytes` gives (a bucket closed only past the cap)."""
    sizes, run = [], 0
    for p in reversed(model["params"]):
        run += p.numel() * p.element_size()
        if run > model["bucket_bytes"]:
            sizes.append(run)
            run = 0
    return sizes + ([run] if run else [])


def _judge_overlap(rank: int, r: dict, step: int, model: dict) -> None:
    """All-reduces started during backward, asynchronously, one per bucket that size gives."""
    s, expect = r["steps"][step], model["expect"]
    reduces = [c for c in s["calls"] if c.kind == "all_reduce"]
    during = [c for c in reduces if c.phase == "backward"]
    if not during or during[0].start >= s["backward_end"]:
        fail(f"step {step}: the first all-reduce started after the last backward had ended",
             rank=rank, hint=OVERLAP)
    if not all(c.async_op for c in during):
        fail(f"step {step}: {sum(not c.async_op for c in during)} all-reduce(s) during "
             "backward were blocking", rank=rank, hint=BLOCKING)
    sizes = [c.nbytes for c in reduces]
    if sizes == expect:
        return
    given = model["bucket_bytes"]
    if given != model["default_bytes"] and sizes == model["default"]:
        hint = FIXED_BUCKET.format(fixed=model["default_bytes"], given=given)
    elif sizes == model["with_frozen"]:
        hint = "the frozen layer's parameters were put in the buckets: " + FROZEN
    elif sizes == _strict(model):
        hint = STRICT.format(given=given)
    elif len(sizes) == len(model["params"]):
        hint = ("one all-reduce per parameter pays the latency alpha every time: bucket them")
    else:
        hint = ("walk the trainable parameters in reverse (the order backward produces "
                "gradients), close a bucket once it holds at least bucket_bytes, and start "
                "each bucket once, in that order (bucket 0 first)")
    fail(f"step {step}: the all-reduces carried {sizes} bytes, in this order; buckets of "
         f"at least bucket_bytes={given} over the trainable parameters, last first, give "
         f"{expect}", rank=rank, hint=hint)
