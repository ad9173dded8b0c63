r"""Graded checks of module 07, exercise 4: the capstone, a tiny GPT trained DP × TP on ranks.

`sync_gradients(model, dp_group)`: every gradient averaged over the DP group. Probed with
rank-valued gradients on the grid of `parlab.mesh` (TP innermost): rank r's gradients are r + 1
everywhere. On DP 2 × TP 2 (DP groups {0, 2} and {1, 3}) the average is 2 on ranks 0 and 2 and
3 on ranks 1 and 3; a sum gives 4 and 6, an all-reduce over the whole world 2.5. The visible
check adds DP 4 × TP 1 (one group of all four: 2.5), where dividing by a fixed 2 shows; the
hidden check runs DP 3 × TP 2 (groups {0, 2, 4} and {1, 3, 5}: 3 and 4). A parameter without a
gradient must keep none. A right answer must not depend on the DP size (2, 3, 4), on whether
the DP group is the whole world (TP 1) or not, or on the parameters' shapes.

`train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None) -> list[float]`: the
whole training loop on each rank. Compared with `parlab.capstone.train_single` at every step
within `parlab.capstone.TOLERANCE`: visible, 12 AdamW steps of DP 2 × TP 2 and 2 SGD steps of
DP 4 × TP 1; hidden, 2 SGD steps of DP 1 × TP 4 and 2 AdamW steps of DP 3 × TP 2 on a batch of
6 (6 ranks). A right answer must not depend on dp or tp (an answer that takes either to be 2,
or dp_rank to be rank // dp, leaves the curve on DP 4 × TP 1), on the optimizer (a summed
gradient passes under AdamW; the visible SGD run has d = 4), or on the batch size.
parlab.comm's tracer checks the shape of the work, because a model that is not split at all also
matches the loss: the TP group must all-reduce activations of shape (batch_size/dp, seq,
hidden) at least twice per layer and step, and the DP group must carry at least this rank's
gradients every step.

The SGD pass is a substitution, not a refusal: inside `optimizer("sgd")`,
`parlab.capstone.make_optimizer` (which the exercise tells the learner to call, and which
`train_single` calls) builds plain SGD, in this process and in the ranks, by swapping its code
object (so every alias of it changes too). It exists because summing the DP gradients instead
of averaging them is invisible under AdamW: Adam divides each gradient by a running estimate
of its own size, so a constant factor d cancels and the losses stay within the tolerance, while
under SGD the step is d times too large and the loss leaves the reference at once.

While the learner's code runs in the ranks, parlab.capstone's own loop and pieces and
parlab.mesh's grid refuse to run; the helpers the exercise names (GPT, TPBlock, batch,
load_corpus, make_optimizer, record_progress and the learner's build_groups and
sync_gradients) run as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from parlab.check._compare import assert_close, fail
from parlab.check._harness import call_learner, exercise, not_reexport, refuse_in_rank, run_checked
from parlab.check.composition.common import KEYS, grid_references
from parlab.launch import device

__all__ = ["check_sync_gradients", "check_capstone", "optimizer", "SGD_LR", "Run", "RUNS"]
REFUSAL = ("parlab.capstone's loop or parlab.mesh's grid (write it from your build_groups "
           "and the pieces the exercise lists)")
AVERAGE = ("divide by the DP group's size after the all-reduce: the single-device gradient is "
           "the mean over the whole batch, and each DP rank's is the mean over its share")
WRONG_GROUP = "all-reduce over dp_group only, not the default (whole-world) group"
FIXED_TWO = ("divide by dist.get_world_size(dp_group), the DP group's size ({dp} here), not by "
             "a fixed 2")
SUMMED_SGD = ("the gradients summed over DP, not averaged: AdamW hides it (it divides each "
              "gradient by its own running size), but under SGD a summed gradient makes every "
              "step d times too large")
HANG = ("every rank must make the same collective calls in the same order: create every group "
        "on every rank (exercise 1b), call sync_gradients and the loss's all-reduce on every "
        "rank, every step")
SGD_LR = 0.5


class Run(NamedTuple):
    """One training run of the capstone check."""

    kind: str  # "adamw" or "sgd" (substituted into make_optimizer)
    dp: int
    tp: int
    batch: int
    steps: int

    @property
    def lr(self) -> float:
        return SGD_LR if self.kind == "sgd" else 3e-3

    def describe(self) -> str:
        return (f"{self.steps} {'SGD' if self.kind == 'sgd' else 'AdamW'} steps of DP {self.dp} "
                f"× TP {self.tp} (batch {self.batch})")


RUNS = {"visible": [Run("adamw", 2, 2, 8, 12), Run("sgd", 4, 1, 8, 2)],
        "hidden": [Run("sgd", 1, 4, 4, 2), Run("adamw", 3, 2, 6, 2)]}
"""What check_capstone runs: the visible test, and (quiet=True, the hidden test, which runs
right after the visible one in the same cell) the hidden runs only. Both vary dp, tp and the
optimizer (the exercise leaves them free): an answer that hard-codes a size, or sums its
gradients over DP, fails the visible test (SGD on DP 4)."""


def _references() -> list[Callable[..., Any]]:
    from parlab import capstone

    return grid_references() + [
        capstone.train_parallel, capstone.setup_parallel, capstone.train_step,
        capstone.sync_gradients, capstone.local_batch, capstone.shard_model]


def _sgd(model: Any, lr: float) -> Any:
    """Replaces make_optimizer's code in the SGD pass (runs with parlab.capstone's globals)."""
    return torch.optim.SGD(model.parameters(), lr=lr)


@contextlib.contextmanager
def optimizer(kind: str) -> Iterator[None]:
    """Inside the block, parlab.capstone.make_optimizer makes plain SGD when kind is "sgd"
    (AdamW otherwise), in this process: a learner's loop and train_single alike. The one
    substitution of the course's checks; see the module docstring for why."""
    from parlab import capstone

    saved = capstone.make_optimizer.__code__
    if kind == "sgd":
        capstone.make_optimizer.__code__ = _sgd.__code__
    try:
        yield
    finally:
        capstone.make_optimizer.__code__ = saved


# --- exercise 4a: sync_gradients --------------------------------------------------------------

def _sync_probe(sync_gradients: Callable[..., None], dp: int, tp: int) -> dict[str, Any]:
    import torch.distributed as dist

    from parlab.mesh import make_mesh, new_groups

    groups = new_groups(make_mesh(dp * tp, dp=dp, tp=tp), axes=("dp", "tp"))
    refuse_in_rank(_references(), REFUSAL)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2),
                                torch.nn.Linear(2, 1, bias=False)).to(device())
    for p in model.parameters():
        p.grad = torch.full_like(p, float(dist.get_rank() + 1))
    model[1].weight.grad = None  # a parameter that took no part: it must stay without one
    call_learner("sync_gradients(model, dp_group)", sync_gradients, model, groups["dp"])
    return {name: None if p.grad is None else p.grad.clone()
            for name, p in model.named_parameters()}


def _sync_hint(got: float, rank: int, dp: int, tp: int) -> str | None:
    """Every likely mistake that gives `got` here, joined by "either ... or" (two can agree:
    with TP 1 the whole world is the DP group)."""
    members = [r for r in range(dp * tp) if r % tp == rank % tp]  # this rank's DP group
    total = float(sum(r + 1 for r in members))
    world = float(sum(range(1, dp * tp + 1)))
    wrong = [(total, AVERAGE)]
    if dp != 2:
        wrong.append((total / 2, FIXED_TWO.format(dp=dp)))
    if tp > 1:  # the whole world is another group than the DP group
        wrong += [(world / (dp * tp), WRONG_GROUP), (world, WRONG_GROUP),
                  (world / dp, WRONG_GROUP)]
    found = list(dict.fromkeys(h for v, h in wrong if abs(got - v) < 1e-9))
    return None if not found else found[0] if len(found) == 1 else (
        "either " + ", or ".join(found))


def _check_sync(sync_gradients: Callable[..., None], dp: int, tp: int) -> None:
    got = run_checked(_sync_probe, dp * tp, sync_gradients, dp, tp, what="sync_gradients",
                      hang_hint=WRONG_GROUP)
    for rank, grads in enumerate(got):
        members = [r for r in range(dp * tp) if r % tp == rank % tp]
        mean = sum(r + 1 for r in members) / dp
        if grads["1.weight"] is not None:
            fail("a parameter whose .grad is None got a gradient", rank=rank,
                 hint="skip parameters with p.grad is None")
        for name in ("0.weight", "0.bias"):
            g = grads[name]
            if g is None:
                fail(f"{name} has no gradient after sync_gradients", rank=rank,
                     hint="update p.grad in place (or assign it); do not set it to None")
            assert_close(g, torch.full_like(g, mean), rank=rank,
                         hint=_sync_hint(float(g.flatten()[0]), rank, dp, tp) or "every rank "
                         "ends with the mean of its DP group's gradients, the group listed here",
                         name=f"{name}.grad after sync_gradients on DP {dp} × TP {tp} (rank r's "
                              f"gradient was r + 1; this rank's DP group is {members})")


@exercise(KEYS["sync_gradients"])
def check_sync_gradients(sync_gradients: Callable[..., None], *, quiet: bool = False) -> None:
    """sync_gradients with rank-valued gradients on DP 2 × TP 2 and DP 4 × TP 1; quiet=True
    (the hidden test, run right after the visible one) on DP 3 × TP 2 instead."""
    not_reexport(sync_gradients, name="sync_gradients")
    for dp, tp in [(3, 2)] if quiet else [(2, 2), (4, 1)]:
        _check_sync(sync_gradients, dp, tp)
    if not quiet:
        print("sync_gradients OK on DP 2 × TP 2 and DP 4 × TP 1: each DP group's gradients "
              "averaged, the TP groups' untouched")


# --- exercise 4b: the training loop -----------------------------------------------------------

def _train_probe(train: Callable[..., list], cfg: Any, run: Run) -> dict[str, Any]:
    import torch.distributed as dist

    from parlab import comm
    from parlab.mesh import make_mesh

    mesh, rank = make_mesh(run.dp * run.tp, dp=run.dp, tp=run.tp), dist.get_rank()
    tp_group, dp_group = (tuple(mesh.group_of(a, rank)) for a in ("tp", "dp"))
    refuse_in_rank(_references(), REFUSAL)
    with optimizer(run.kind), comm.trace() as tr:
        losses = call_learner(f"train_dp_tp with {run.describe()}", lambda: train(
            cfg, run.steps, dp=run.dp, tp=run.tp, batch_size=run.batch, lr=run.lr),
            hint=None if (run.dp, run.tp) == (2, 2) else _sizes_hint(run))
    activation = (run.batch // run.dp, cfg.seq, cfg.hidden)
    tp_acts = sum(1 for e in tr.events if e.kind == "all_reduce"
                  and tuple(e.group_ranks) == tp_group and tuple(e.shape) == activation)
    dp_elems = sum(e.nbytes // 4 for e in tr.events if e.kind == "all_reduce"
                   and tuple(e.group_ranks) == dp_group)
    return {"losses": losses, "tp_acts": tp_acts, "dp_elems": dp_elems}


def _shard_params(cfg: Any, tp: int) -> int:
    """Parameters one TP rank holds: blocks split over t, the rest replicated."""
    from parlab.model.gpt import GPT

    model = GPT(cfg)
    blocks = sum(p.numel() for p in model.blocks.parameters())
    norms = sum(p.numel() for n, p in model.blocks.named_parameters() if ".ln" in n)
    total = sum(p.numel() for p in model.parameters())
    return total - blocks + norms + (blocks - norms) // tp


def _sizes_hint(run: Run) -> str:
    return (f"DP 2 × TP 2 passed and DP {run.dp} × TP {run.tp} does not, so something "
            "depends on the sizes: take every size from the arguments (dp_rank = rank // tp, "
            "b = batch_size // dp, the loss divided by dp), never a fixed 2")


def _compare(losses: Any, reference: list[float], run: Run) -> None:
    from parlab.capstone.train import TOLERANCE

    if not isinstance(losses, (list, tuple)) or len(losses) != len(reference):
        fail(f"train_dp_tp returned {type(losses).__name__} of length "
             f"{len(losses) if hasattr(losses, '__len__') else '?'}, expected a list of "
             f"{len(reference)} losses, one per step",
             hint="append the step's DP-averaged loss (a float) to a list every step; return it")
    for step, (got, want) in enumerate(zip(losses, reference, strict=True)):
        if not abs(float(got) - want) <= TOLERANCE:
            hint = ("see the list of steps in the exercise: the usual culprits are a missing "
                    "sync_gradients, both DP ranks on the same rows, or a loss that is not "
                    "averaged over the DP group")
            if run.kind == "sgd" and step > 0 and run.dp > 1:
                # the losses agreed until the first update: the update is off
                hint = (f"the loss matched at step 0 and not after the first update: either "
                        f"{SUMMED_SGD}, or " + (
                            "the gradients divided by a fixed number, not by dp"
                            if (run.dp, run.tp) == (2, 2) else
                            "something depends on the sizes: take every size from the "
                            "arguments (dp_rank = rank // tp, b = batch_size // dp, the "
                            "gradients and the loss averaged over dp), never a fixed 2"))
            elif (run.dp, run.tp) != (2, 2):
                hint = _sizes_hint(run) + "; " + hint
            fail(f"train_dp_tp with {run.describe()}, step {step}: loss {float(got):.6f}, "
                 f"single device {want:.6f}, difference {abs(float(got) - want):.2e} > "
                 f"tolerance {TOLERANCE:g}", hint=hint)


def _check_run(train: Callable[..., list], run: Run) -> None:
    from parlab.capstone.train import train_single
    from parlab.model.gpt import GPTConfig

    cfg = GPTConfig()
    with optimizer(run.kind):
        reference = train_single(cfg, run.steps, batch_size=run.batch, lr=run.lr)
    results = run_checked(_train_probe, run.dp * run.tp, train, cfg, run, what="train_dp_tp",
                          timeout=60, hang_hint=HANG)
    for rank, r in enumerate(results):
        if run.tp > 1 and r["tp_acts"] < 2 * cfg.layers * run.steps:
            fail(f"the TP group all-reduced {r['tp_acts']} activations of shape "
                 f"({run.batch // run.dp}, {cfg.seq}, {cfg.hidden}) in {run.steps} steps, "
                 f"expected at least {2 * cfg.layers * run.steps}", rank=rank,
                 hint="split every block with TPBlock.from_block(block, group=your tp group), "
                      "and feed it only this DP rank's batch_size/dp rows")
        if r["dp_elems"] < _shard_params(cfg, run.tp) * run.steps:
            fail(f"the DP group all-reduced {r['dp_elems']} values in {run.steps} steps, less "
                 f"than this rank's {_shard_params(cfg, run.tp)} gradients per step", rank=rank,
                 hint="call your sync_gradients(model, dp_group) after every backward")
        _compare(r["losses"], reference, run)


@exercise(KEYS["capstone"], needs={KEYS["build_groups"]: "build_groups (exercise 1b)",
                                   KEYS["sync_gradients"]: "sync_gradients (exercise 4a)"})
def check_capstone(train_dp_tp: Callable[..., list], *, quiet: bool = False) -> None:
    """train_dp_tp against the single-device run: RUNS["visible"]; quiet=True (the hidden
    test) RUNS["hidden"] instead (SGD, and DP 3)."""
    not_reexport(train_dp_tp, name="train_dp_tp")
    for run in RUNS["hidden" if quiet else "visible"]:
        _check_run(train_dp_tp, run)
    if not quiet:
        print(f"train_dp_tp OK: {RUNS['visible'][0].describe()} and "
              f"{RUNS['visible'][1].describe()} match the single-device losses, with the "
              "blocks split and the gradients synced")
