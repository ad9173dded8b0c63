r"""Module 03, exercise 2: dropout on a sequence shard.

The keep-masks of the whole (B, T, C) activation are drawn by `parlab.tp.dropout_keep_mask`
from a generator seeded the same way; rank r's (2, 4, 8) shard of the (2, 4t, 8) float64
activation must come out as rows r of `hidden_dropout` of the whole, twice in a row from one
generator and again from a fresh generator of the same seed (rtol=1e-12: only the rounding of
x / (1 - p_drop) against x * (1 / (1 - p_drop)) may differ). The default p_drop = 0.25
separates the right scale 1/(1 - p_drop) = 4/3 from the wrong 1/p_drop = 4, and the right mask
(drop where rand < p_drop) from the inverted one; at p_drop = 0.5 both pairs would agree.

The function must not change its input (it is given a non-leaf tensor, so autograd does not
stop an in-place answer), and what it saves for backward must be a bool mask of its rows (one
byte per element: a slice of the whole mask keeps all of it alive).

A right answer must not depend on p_drop (the visible test also drops with 0.1), on t (2 and 3
ranks visible, 4 hidden: the whole mask is t times the shard), on the shard's shape (read from
x), or on the device x lives on (the mask is drawn on the CPU generator, then moved).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, run_checked
from parlab.check.sp.common import (
    HANG,
    KEY_DROPOUT,
    SAME_SEED,
    guard,
    reject_reference,
    rows,
    story,
)
from parlab.check.tp.common import cpu, env, unchanged

__all__ = ["check_sp_dropout"]
TOL = {"rtol": 1e-12, "atol": 0.0}
EXAMPLE_P = 0.25  # the notebook's p_drop, and the visible test's first
STAGE = "sp_dropout(x, p_drop, generator)"
MASK_SHAPE = ("the whole mask is (B, T, C) with T = t * T/t rows: take t from "
              "dist.get_world_size() and the shard's size from x.shape, then keep rows "
              "r*T/t:(r+1)*T/t (the sequence is dim 1)")
MASK_HINT = ("draw the mask exactly as hidden_dropout does, for the whole (B, T, C) activation: "
             "keep = torch.rand((B, T, C), generator=generator) >= p_drop; then keep this "
             "rank's rows")


def _full_input(t: int) -> torch.Tensor:
    return (1 + torch.arange(2 * 4 * t * 8, dtype=torch.float64) / 64).reshape(2, 4 * t, 8)


def _dropout_worker(dropout: Callable, p_drop: float, seed: int) -> dict:
    from parlab.costs.activations import SavedTensorMeter

    rank, t, dev = env()
    meter = SavedTensorMeter()
    enter = meter.__enter__  # bound before the guard blocks parlab's meter for the learner
    guard()
    leaf = rows(_full_input(t), rank, t).contiguous().to(dev).requires_grad_()  # (2, 4, 8)
    x = leaf * 1.0  # not a leaf: autograd would refuse an in-place answer on a leaf
    before = cpu(x)
    gen = torch.Generator().manual_seed(seed)
    enter()
    try:
        first = call_learner(STAGE, dropout, x, p_drop, gen, shape_hint=MASK_SHAPE)
    finally:
        meter.__exit__(None, None, None)
    unchanged(before, x, "x (the tensor given to sp_dropout)", rank)
    second = call_learner(STAGE, dropout, x.detach(), p_drop, gen, shape_hint=MASK_SHAPE)
    again = call_learner(STAGE, dropout, x.detach(), p_drop,
                         torch.Generator().manual_seed(seed), shape_hint=MASK_SHAPE)
    unchanged(before, x, "x (the tensor given to sp_dropout)", rank)
    grad = None
    if isinstance(first, torch.Tensor) and first.shape == x.shape and first.requires_grad:
        first.sum().backward()
        grad = cpu(leaf.grad)
    return {"first": cpu(first), "second": cpu(second), "again": cpu(again), "grad": grad,
            "saved": meter.total, "numel": x.numel()}


def _stories(full: torch.Tensor, keep: torch.Tensor, p_drop: float, rank: int,
             t: int, example: torch.Tensor | None) -> list[tuple[Any, str]]:
    """Wrong answers of rank's first call, each with what it says about the mistake."""
    drop = ~keep
    return [
        (rows(full * keep, rank, t), "the kept values must be scaled by 1/(1 - p_drop)"),
        (rows(full * keep / p_drop, rank, t),
         f"the kept values are scaled by 1/p_drop = {1 / p_drop:g}: scale them by "
         f"1/(1 - p_drop) = {1 / (1 - p_drop):g}, one over the probability of KEEPING an "
         "element, so that the expected value is unchanged"),
        (rows(full * keep * (1 - p_drop), rank, t),
         "the kept values are multiplied by (1 - p_drop): divide by it instead, so that the "
         "expected value is unchanged"),
        (rows(full * drop / (1 - p_drop), rank, t),
         "the mask is inverted: p_drop is the probability of DROPPING an element, so keep "
         "where torch.rand(...) >= p_drop"),
        (rows(full * drop / p_drop, rank, t),
         "the mask is inverted and scaled by 1/p_drop: p_drop is the probability of DROPPING; "
         "keep = torch.rand(...) >= p_drop, x * keep / (1 - p_drop)"),
    ] + [(rows(full * keep / (1 - p_drop), q, t), f"it applies rank {q}'s rows of the mask: "
          "rank r keeps rows r*T/t:(r+1)*T/t") for q in range(t) if q != rank] + [
        (rows(full * e / (1 - EXAMPLE_P), rank, t),
         f"it dropped with p_drop = {EXAMPLE_P}, the notebook's example, not the p_drop = "
         f"{p_drop:g} it was given: read p_drop from the argument")
        for e in [example] if e is not None]


def _check_saved(r: dict, rank: int, t: int) -> None:
    if r["saved"] > r["numel"]:
        whole = r["saved"] == t * r["numel"]
        fail(f"sp_dropout keeps {r['saved']} bytes for backward for a shard of "
             f"{r['numel']} elements; a bool mask of its rows needs {r['numel']}", rank=rank,
             hint="it keeps the whole (B, T, C) mask alive: a slice is a view of it; "
                  ".clone() your rows" if whole else "keep the mask as bool (1 byte per "
                  "element) and multiply by it: a float mask costs 4 bytes per element")


@exercise(KEY_DROPOUT)
def check_sp_dropout(dropout: Callable, *, world_size: int = 2, p_drop: float = EXAMPLE_P,
                     seed: int = 7, timeout: float = CHECK_TIMEOUT_S,
                     quiet: bool = False) -> None:
    """sp_dropout(x, p_drop, generator) on rank r's (2, 4, 8) shard of a (2, 4t, 8) activation
    must equal rows r of hidden_dropout on the whole activation, drawn from the same seed."""
    from parlab.tp.sequence import dropout_keep_mask

    reject_reference(dropout, "sp_dropout")
    t = world_size
    results = run_checked(_dropout_worker, t, dropout, p_drop, seed, what="sp_dropout",
                          timeout=timeout, hang_hint=HANG)
    full = _full_input(t)
    gen = torch.Generator().manual_seed(seed)
    keeps = [dropout_keep_mask(tuple(full.shape), p_drop=p_drop, generator=gen)
             for _ in range(2)]
    example = None if p_drop == EXAMPLE_P else dropout_keep_mask(
        tuple(full.shape), p_drop=EXAMPLE_P, generator=torch.Generator().manual_seed(seed))
    masks = [r["first"] != 0 for r in results if isinstance(r["first"], torch.Tensor)]
    same = t > 1 and len(masks) == t and all(
        m.shape == masks[0].shape and torch.equal(m, masks[0]) for m in masks)
    for rank, r in enumerate(results):
        stories = _stories(full, keeps[0], p_drop, rank, t, example)
        hint = SAME_SEED if same else story(r["first"], stories)
        assert_close(r["first"], rows(full * keeps[0] / (1 - p_drop), rank, t), rank=rank,
                     **TOL,
                     name=f"sp_dropout(x) (p_drop = {p_drop}, random seed {seed})",
                     hint=hint or MASK_HINT)
        assert_close(r["grad"], rows(keeps[0].double() / (1 - p_drop), rank, t), rank=rank,
                     **TOL,
                     name="grad of x through sp_dropout",
                     hint="let autograd see x * keep / (1 - p_drop): do not detach")
        assert_close(r["second"], rows(full * keeps[1] / (1 - p_drop), rank, t), rank=rank,
                     **TOL,
                     name="a second sp_dropout call with the same generator",
                     hint="each call draws the next whole mask from the generator it is given: "
                          "do not re-seed it or make a new one inside sp_dropout")
        assert_close(r["again"], r["first"], rank=rank, **TOL, name="sp_dropout with a fresh "
                     "generator of the same seed", hint="the same seed must give the same "
                     "masks: use only the generator passed in")
        _check_saved(r, rank, t)
    if not quiet:
        print(f"sp_dropout OK on {t} ranks: each shard's mask is its rows of the single-device "
              f"mask (p_drop = {p_drop}, random seed {seed}), call after call; it keeps 1 byte "
              "per element")
