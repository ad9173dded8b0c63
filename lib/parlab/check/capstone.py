r"""Graded checks of module 07, exercise 4: the capstone, DP 2 × TP 2 on 4 ranks.

`sync_gradients(model, dp_group)`: every gradient averaged over the DP group. Probed with
rank-valued gradients on the grid of `parlab.mesh` (DP groups {0, 2} and {1, 3}): rank r's
gradients are r + 1 everywhere, so the average is 2 on ranks 0 and 2 and 3 on ranks 1 and 3;
a sum gives 4 and 6, an all-reduce over the whole world 2.5. A parameter without a gradient
must keep none.

`train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None) -> list[float]`: the
whole training loop on each rank. Compared with `parlab.capstone.train_single` at every step
within `parlab.capstone.TOLERANCE`, once with AdamW (the real run) and, in the hidden test,
once with plain SGD swapped into `parlab.capstone.make_optimizer` on both sides: Adam divides
each gradient by its own size, so a sum instead of an average hides under Adam and shows at
once under SGD. parlab.comm's tracer checks the shape of the work, because a model that is
not split at all also matches the loss: the TP group must all-reduce activations of shape
(batch_size/dp, seq, hidden) at least twice per layer and step, and the DP group must carry at
least this rank's gradients every step.

While the learner's code runs, parlab's own capstone pieces and rank grid raise CheckFailed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from parlab.check import CheckFailed, assert_close, fail, not_reexport, ranks
from parlab.check.composition import _reference_functions
from parlab.errors import refused
from parlab.launch import CollectiveTimeout, RankError

__all__ = ["check_sync_gradients", "check_capstone", "optimizer", "CheckFailed"]
REFERENCE = ("your answer runs parlab.capstone's (or parlab.mesh's) own implementation; the "
             "exercise is to write it yourself from your build_groups and the pieces the "
             "notebook lists")
AVERAGE = ("divide by the DP group's size after the all-reduce: the single-device gradient is "
           "the mean over the whole batch, and each DP rank's is the mean over its half")
WRONG_GROUP = "all-reduce over dp_group only, not the default (whole-world) group"
DP, TP, BATCH, LR = 2, 2, 8, 3e-3
STEPS = {"adamw": 12, "sgd": 4}
SGD_LR = 0.5


def _capstone_functions() -> list[Callable[..., Any]]:
    from parlab import capstone

    return _reference_functions() + [
        capstone.train_parallel, capstone.setup_parallel, capstone.train_step,
        capstone.sync_gradients, capstone.local_batch, capstone.shard_model]


def _sgd(model: Any, lr: float) -> Any:
    """Replaces make_optimizer's code in the hidden pass (runs with parlab.capstone's globals)."""
    return torch.optim.SGD(model.parameters(), lr=lr)


@contextlib.contextmanager
def optimizer(kind: str) -> Iterator[None]:
    """Inside the block, parlab.capstone.make_optimizer makes plain SGD when kind is "sgd"
    (AdamW otherwise), in this process: a learner's loop and train_single alike."""
    from parlab import capstone

    saved = capstone.make_optimizer.__code__
    if kind == "sgd":
        capstone.make_optimizer.__code__ = _sgd.__code__
    try:
        yield
    finally:
        capstone.make_optimizer.__code__ = saved


def _call(stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    import torch.distributed as dist

    try:
        with refused(_capstone_functions(), REFERENCE):
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{stage} raised {type(exc).__name__}: {exc}", rank=dist.get_rank(),
             hint="read the error above")


def _sync_probe(sync_gradients: Callable[..., None]) -> dict[str, Any]:
    import torch.distributed as dist

    from parlab.check.capstone import _call as call
    from parlab.mesh import make_mesh, new_groups

    groups = new_groups(make_mesh(4, dp=DP, tp=TP), axes=("dp", "tp"))
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False))
    for p in model.parameters():
        p.grad = torch.full_like(p, float(dist.get_rank() + 1))
    model[1].weight.grad = None  # a parameter that took no part: it must stay without one
    call("sync_gradients(model, dp_group)", sync_gradients, model, groups["dp"])
    return {name: None if p.grad is None else p.grad.clone()
            for name, p in model.named_parameters()}


def check_sync_gradients(sync_gradients: Callable[..., None], *, quiet: bool = False) -> None:
    """sync_gradients on 4 ranks (DP 2 × TP 2) with rank-valued gradients."""
    not_reexport(sync_gradients, name="sync_gradients")
    try:
        got = ranks(_sync_probe, 4, sync_gradients)
    except CollectiveTimeout as exc:
        fail(f"sync_gradients hung on 4 ranks: {exc}", hint=WRONG_GROUP)
    except RankError as exc:
        fail(f"sync_gradients failed on 4 ranks: {exc}")
    for rank, grads in enumerate(got):
        mean = {0: 2.0, 1: 3.0, 2: 2.0, 3: 3.0}[rank]  # DP groups {0, 2} and {1, 3}
        if grads["1.weight"] is not None:
            fail("a parameter whose .grad is None got a gradient", rank=rank,
                 hint="skip parameters with p.grad is None")
        for name in ("0.weight", "0.bias"):
            g = grads[name]
            if g is None:
                fail(f"{name} has no gradient after sync_gradients", rank=rank,
                     hint="update p.grad in place (or assign it); do not set it to None")
            hint = {2 * mean: AVERAGE, 2.5: WRONG_GROUP, 5.0: WRONG_GROUP, 10.0: WRONG_GROUP}.get(
                float(g.flatten()[0]))
            assert_close(g, torch.full_like(g, mean), rank=rank, hint=hint,
                         name=f"{name}.grad after sync_gradients (rank r's gradient was r + 1)")
    if not quiet:
        print("sync_gradients OK: each DP group's gradients averaged, the TP groups' untouched")


def _train_probe(train: Callable[..., list], cfg: Any, kind: str) -> dict[str, Any]:
    import torch.distributed as dist

    from parlab import comm
    from parlab.check.capstone import _call as call
    from parlab.check.capstone import optimizer
    from parlab.mesh import make_mesh

    mesh, rank = make_mesh(4, dp=DP, tp=TP), dist.get_rank()
    tp_group, dp_group = (tuple(mesh.group_of(a, rank)) for a in ("tp", "dp"))
    with optimizer(kind), comm.trace() as tr:
        losses = call("train_dp_tp", train, cfg, STEPS[kind], dp=DP, tp=TP, batch_size=BATCH,
                      lr=SGD_LR if kind == "sgd" else LR)
    activation = (BATCH // DP, cfg.seq, cfg.hidden)
    tp_acts = sum(1 for e in tr.events if e.kind == "all_reduce"
                  and tuple(e.group_ranks) == tp_group and tuple(e.shape) == activation)
    dp_elems = sum(e.nbytes // 4 for e in tr.events if e.kind == "all_reduce"
                   and tuple(e.group_ranks) == dp_group)
    return {"losses": losses, "tp_acts": tp_acts, "dp_elems": dp_elems}


def _shard_params(cfg: Any) -> int:
    """Parameters one TP rank holds: blocks split over t, the rest replicated."""
    from parlab.model.gpt import GPT

    model = GPT(cfg)
    blocks = sum(p.numel() for p in model.blocks.parameters())
    norms = sum(p.numel() for n, p in model.blocks.named_parameters() if ".ln" in n)
    total = sum(p.numel() for p in model.parameters())
    return total - blocks + norms + (blocks - norms) // TP


def _compare(losses: Any, reference: list[float], kind: str) -> None:
    from parlab.capstone.train import TOLERANCE

    if not isinstance(losses, (list, tuple)) or len(losses) != len(reference):
        fail(f"train_dp_tp returned {type(losses).__name__} of length "
             f"{len(losses) if hasattr(losses, '__len__') else '?'}, expected a list of "
             f"{len(reference)} losses, one per step")
    for step, (got, want) in enumerate(zip(losses, reference, strict=True)):
        if not abs(float(got) - want) <= TOLERANCE:
            hint = (AVERAGE + " (under SGD a summed gradient doubles every step)"
                    if kind == "sgd" else "see the list of steps in the exercise: the usual "
                    "culprits are a missing sync_gradients, both DP ranks on the same rows, or "
                    "a loss that is not averaged over the DP group")
            fail(f"train_dp_tp with {'SGD' if kind == 'sgd' else 'AdamW'}, step {step}: loss "
                 f"{float(got):.6f}, single device {want:.6f}, difference "
                 f"{abs(float(got) - want):.2e} > tolerance {TOLERANCE:g}", hint=hint)


def _check_run(train: Callable[..., list], kind: str) -> list[float]:
    from parlab.capstone.train import train_single
    from parlab.model.gpt import GPTConfig

    cfg = GPTConfig()
    with optimizer(kind):
        reference = train_single(cfg, STEPS[kind], batch_size=BATCH,
                                 lr=SGD_LR if kind == "sgd" else LR)
    try:
        results = ranks(_train_probe, DP * TP, train, cfg, kind, timeout=60)
    except CollectiveTimeout as exc:
        fail(f"train_dp_tp hung on 4 ranks: {exc}")
    except RankError as exc:
        fail(f"train_dp_tp failed on 4 ranks: {exc}")
    for rank, r in enumerate(results):
        if r["tp_acts"] < 2 * cfg.layers * STEPS[kind]:
            fail(f"the TP group all-reduced {r['tp_acts']} activations of shape "
                 f"({BATCH // DP}, {cfg.seq}, {cfg.hidden}) in {STEPS[kind]} steps, expected at "
                 f"least {2 * cfg.layers * STEPS[kind]}", rank=rank,
                 hint="split every block with TPBlock.from_block(block, group=your tp group), "
                      "and feed it only this DP rank's batch_size/dp rows")
        if r["dp_elems"] < _shard_params(cfg) * STEPS[kind]:
            fail(f"the DP group all-reduced {r['dp_elems']} values in {STEPS[kind]} steps, less "
                 f"than this rank's {_shard_params(cfg)} gradients per step", rank=rank,
                 hint="call your sync_gradients(model, dp_group) after every backward")
        _compare(r["losses"], reference, kind)
    return reference


def check_capstone(train_dp_tp: Callable[..., list], *, quiet: bool = False) -> None:
    """train_dp_tp on DP 2 × TP 2 against the single-device run (AdamW; hidden: also SGD)."""
    not_reexport(train_dp_tp, name="train_dp_tp")
    _check_run(train_dp_tp, "adamw")
    if quiet:
        _check_run(train_dp_tp, "sgd")
    else:
        print(f"train_dp_tp OK: {STEPS['adamw']} steps of DP {DP} × TP {TP} match the "
              "single-device losses, with the blocks split and the gradients synced")
