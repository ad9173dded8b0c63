r"""Module 08, exercise 3: the 3D training step, DP × PP × TP (+SP), composed by the learner.

`train_3d(cfg, plan, steps, *, lr, make_optimizer) -> list[float]` runs on every rank of
`plan.world_size` and returns the global mean loss of every step. Compared with, all computed
here or by the single-device reference:

- the single-device losses at every step, within `parlab.compose.TOLERANCE`, under plain SGD
  (a single-device SGD loop written here), where a gradient off by a constant factor (summed
  instead of averaged over DP) moves the loss at once instead of hiding under Adam's
  normalisation: on DP 2 × PP 2 × TP 2 with SP, 8 ranks, and in the hidden test on
  DP 3 × PP 2, 6 ranks;
- what the ranks hold after training, read from the optimizer `make_optimizer` built (the
  check passes its own, which records the parameters): every DP replica the same weights,
  every TP rank the same RMSNorm weights (1-D parameters), the first and last pipeline stage
  the same tied embedding. These name the forgotten reduction before the losses drift;
- the tracer: all-reduces over this rank's DP group, calls over its TP group (TP > 1) and
  point-to-point messages (PP > 1): the work is really split (a model copied whole onto every
  rank also matches the loss);
- the rows of the global batch each replica's stages ran (`step_rows`): each replica's
  first stage its own B/d rows, together every row once, every stage B/d rows a step. Every
  replica on the whole batch also matches the loss, for d times the work.

While the answer runs, `parlab.compose`'s own composition (train, train_step, setup,
finalize_grads, its data-parallel syncs) and `parlab.dp.ddp` raise CheckFailed; the pieces
(make_grid, ParallelLlama, split_layers, run_schedule, sum_grads, make_schedule,
allreduce_sequence_parallel_grads) are allowed. `run_schedule` without `sync=` falls back to
the course's own BucketedDDP: refused with its own message (the answer's DP sync is not in the
schedule).

What a right answer must not depend on, and how the tests vary it:

- the grid: DP 2 × PP 2 × TP 2 + SP on 8 ranks (visible), DP 3 × PP 2 without TP on 6
  (hidden); the sizes come from `plan`, the groups from `make_grid`;
- the batch: B = 8 in micro-batches of 2 (visible), B = 6 in micro-batches of 1 (hidden);
  each replica's share B/d is checked, not only the losses;
- the optimizer: the check passes its own `make_optimizer` (SGD, where a gradient off by a
  constant factor shows at once; the answer must not build its own);
- the step: 3 steps (visible), 2 (hidden), each with its own batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport, refuse_in_rank, run_checked
from parlab.check.whole.common import DDP_NEEDS, KEY_TRAIN, CallLog, ddp_references
from parlab.check.whole.step_rows import RowTap, judge_rows
from parlab.errors import refused

LR = {"adamw": 3e-3, "sgd": 0.5}
TIMEOUT_S = 45.0  # 8 ranks on 2 cores: about 8 s alone, up to 3 x that beside other work
HANG = ("a collective that only some ranks reach, for example the DP sync over the whole world "
        "(or the default group) instead of grid.dp, which mixes ranks of different stages whose "
        "buckets differ; sum_grads over grid.embedding on a rank that is in no such group; "
        "every rank must run the same reductions over its own groups")
HINTS = {
    "dp": ("the DP replicas hold different weights after training, so their gradients were "
           "not averaged over grid.dp (no DP sync, or one over another group): pass your "
           "OverlappedDDP over grid.dp to run_schedule as sync=[ddp] and call its finish() "
           "after run_schedule and before the optimizer step"),
    "sp": ("the TP ranks hold different RMSNorm weights: under sequence parallelism each rank "
           "saw only its own tokens, so those gradients are partial sums; sum them over "
           "grid.tp (allreduce_sequence_parallel_grads(model.sequence_parallel_params(), "
           "group=grid.tp)) before the optimizer step"),
    "tied": ("the first and the last pipeline stage hold different copies of the tied "
             "embedding: each copy got one use's gradient; add them with "
             "sum_grads(model.embedding_copies(), group=grid.embedding)"),
    "step0": ("the loss of step 0, before any update, is already off: the forward differs "
              "(this replica's rows grid.batch_rows, the positions grid.positions, the "
              "micro-batches of plan.micro_batch_size), or the loss is not the global mean "
              "(sum over grid.pp, then average over grid.dp)"),
    "later": ("step 0's loss is right and later ones drift: the gradients are wrong (a sum "
              "instead of a mean over DP shows under SGD; check every reduction after "
              "backward, and that the optimizer steps every parameter once)"),
}


SYNC_NONE = ("rank {rank}: run_schedule(...) was called without sync=, so its backwards synced "
             "DP with the course's own BucketedDDP over grid.dp (what run_schedule falls back "
             "to, refused here), not with yours\nLikely mistake: your DP sync is not in "
             "run_schedule: build ddp = OverlappedDDP(model.parameters(), group=grid.dp, "
             "bucket_bytes=...), pass sync=[ddp] to run_schedule (it runs the earlier "
             "micro-batches' backwards inside ddp.no_sync()) and call ddp.finish() before the "
             "optimizer step")
_KEPT: list[Any] = []  # the refusal of run_schedule's fallback, open for the rank's life


def composition_references() -> list[Any]:
    from parlab.compose.grads import finalize_grads
    from parlab.compose.train import setup, train, train_step

    return [*ddp_references(), train, train_step, setup, finalize_grads]


def _groups(plan: Any) -> dict[str, tuple[list[int], Any]]:
    """This rank's dp, tp, pp lines and its tied-embedding pair, from the mesh (every rank
    creates every group, in the same order)."""
    from parlab.mesh import make_mesh

    mesh = make_mesh(plan.world_size, dp=plan.dp, pp=plan.pp, tp=plan.tp)
    rank, mine = dist.get_rank(), {}  # axis -> (its ranks, its group)
    for axis in ("dp", "tp", "pp"):
        for line in mesh.groups(axis):
            group = dist.new_group(line)
            if rank in line:
                mine[axis] = (line, group)
    for line in mesh.groups("pp"):
        pair = sorted({line[0], line[-1]})
        group = dist.new_group(pair)
        if rank in pair:
            mine["tied"] = (pair, group)
    return mine


def _same(t: torch.Tensor, group: Any) -> bool:
    """Every rank of `group` holds the same values (an all-gather of t, compared)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return all(torch.allclose(p, parts[0], rtol=1e-6, atol=1e-7) for p in parts)


def _consistency(params: list[torch.Tensor], groups: dict, plan: Any, vocab: int) -> str | None:
    """The first reduction whose absence shows in the weights: dp, sp or tied."""
    flat = torch.cat([p.detach().reshape(-1) for p in params]) if params else torch.zeros(1)
    if plan.dp > 1 and not _same(flat, groups["dp"][1]):
        return "dp"
    norms = [p.detach() for p in params if p.dim() == 1]
    if plan.tp > 1 and norms and not _same(torch.cat(norms), groups["tp"][1]):
        return "sp"
    if plan.pp > 1 and "tied" in groups:
        rows = (vocab, -(-vocab // plan.tp))  # whole, or one TP rank's vocabulary rows
        table = [p.detach() for p in params if p.dim() == 2 and p.shape[0] in rows]
        if table and not _same(table[0], groups["tied"][1]):
            return "tied"
    return None


def _worker(train_3d: Callable[..., Any], cfg: Any, plan: Any, steps: int, kind: str) -> dict:
    groups = _groups(plan)
    built: list[list[torch.Tensor]] = []

    def make_optimizer(params: Any, lr: float) -> torch.optim.Optimizer:
        params = list(params)
        built.append(params)
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.SGD
        opt = cls(params, lr=lr)
        opt.register_step_post_hook(tap.step_done)  # the rows seen are counted step by step
        return opt

    refuse_in_rank(composition_references(), "parlab.compose's own training step (or "
                   "parlab.dp.ddp.BucketedDDP: pass your OverlappedDDP to run_schedule as "
                   "sync=[ddp])")
    from parlab.compose.grads import data_parallel  # run_schedule's fallback when sync=None

    _KEPT.append(refused([data_parallel], SYNC_NONE.format(rank=dist.get_rank())))
    _KEPT[-1].__enter__()
    log, tap = CallLog(), RowTap()
    tap.install()
    try:
        with log.watch():
            losses = call_learner(f"train_3d(cfg, plan, {steps}, lr=..., make_optimizer=...)",
                                  lambda: train_3d(cfg, plan, steps, lr=LR[kind],
                                                   make_optimizer=make_optimizer))
    finally:
        tap.remove()
    if not built:
        fail("train_3d never called make_optimizer", rank=dist.get_rank(),
             hint="build the optimizer with make_optimizer(model.parameters(), lr=lr): the "
                  "check passes its own (AdamW, or SGD in the hidden test)")
    who: dict[str, list[int]] = {a: groups[a][0] for a in ("dp", "tp", "pp")}
    seen = {a: any(c.group == tuple(who[a]) for c in log.calls) for a in ("dp", "tp")}
    seen["pp"] = any(c.kind in ("isend", "send", "irecv", "recv") for c in log.calls)
    coords = {a: who[a].index(dist.get_rank()) for a in ("dp", "tp", "pp")}
    return {"losses": losses, "broken": _consistency(built[-1], groups, plan, cfg.vocab),
            "seen": seen, "groups": who, "coords": coords, "taps": tap.result()}


def _single_sgd(cfg: Any, steps: int, batch_size: int, lr: float) -> list[float]:
    from parlab.model import Llama, batch, load_corpus

    model, tokens = Llama(cfg), load_corpus()[0]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
        opt.zero_grad(set_to_none=True)
        loss = Llama.loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _judge(results: list[dict], plan: Any, cfg: Any, reference: list[float], steps: int
           ) -> float:
    from parlab.compose import TOLERANCE

    for rank, r in enumerate(results):
        if r["broken"] is not None:
            fail(f"after {steps} steps on {plan.world_size} ranks ({_label(plan)})",
                 rank=rank, hint=HINTS[r["broken"]])
        for axis, size in (("dp", plan.dp), ("tp", plan.tp), ("pp", plan.pp)):
            if size > 1 and not r["seen"][axis]:
                fail(f"no communication over this rank's {axis.upper()} group "
                     f"{r['groups'][axis]}", rank=rank,
                     hint="build the model with ParallelLlama on make_grid(dp=..., pp=..., "
                          "tp=...) and run its stages with run_schedule: a copy of the whole "
                          "model on every rank matches the loss without splitting anything")
    judge_rows(results, plan, cfg, steps)
    losses = results[0]["losses"]
    if not isinstance(losses, (list, tuple)) or len(losses) != steps:
        fail(f"train_3d returned {losses!r:.80}, expected a list of {steps} losses",
             hint="return one float per step: the global mean loss")
    for rank, r in enumerate(results):
        if [float(v) for v in r["losses"]] != [float(v) for v in losses]:
            fail(f"rank {rank} returned other losses than rank 0", rank=rank,
                 hint="every rank must return the global mean: sum the last stage's loss "
                      "over grid.pp, then average over grid.dp")
    gaps = [abs(float(a) - b) for a, b in zip(losses, reference, strict=True)]
    bad = next((i for i, g in enumerate(gaps) if g > TOLERANCE), None)
    if bad is not None:
        fail(f"step {bad}: loss {float(losses[bad]):.6f} on {plan.world_size} ranks "
             f"({_label(plan)}), {reference[bad]:.6f} on one device (gap {gaps[bad]:.2e}, "
             f"tolerance {TOLERANCE:g})", hint=HINTS["step0" if bad == 0 else "later"])
    return max(gaps)


def _label(plan: Any) -> str:
    sp = " + SP" if plan.sequence_parallel else ""
    return f"DP {plan.dp} × PP {plan.pp} × TP {plan.tp}{sp}"


@exercise(KEY_TRAIN, needs=DDP_NEEDS)
def check_train_3d(train_3d: Callable[..., Any], *, quiet: bool = False,
                   timeout: float = TIMEOUT_S) -> dict:
    """train_3d on 8 ranks: the single-device losses at every step, consistent replicas, and
    the work really split; SGD on DP2 × PP2 × TP2 + SP, on DP3 × PP2 when quiet."""
    from parlab.compose import Plan
    from parlab.model import LlamaConfig

    not_reexport(train_3d, name="train_3d")
    cfg = LlamaConfig()
    if quiet:  # the hidden test: other sizes, no TP
        plan, steps = Plan(dp=3, pp=2, micro_batch_size=1, global_batch_size=6), 2
    else:
        plan = Plan(dp=2, pp=2, tp=2, sequence_parallel=True, micro_batch_size=2,
                    global_batch_size=8)
        steps = 3
    kind = "sgd"  # a gradient off by a constant factor moves the loss at once (not under Adam)
    reference = _single_sgd(cfg, steps, plan.global_batch_size, LR["sgd"])
    results = run_checked(_worker, plan.world_size, train_3d, cfg, plan, steps, kind,
                          what="train_3d", timeout=timeout, hang_hint=HANG)
    gap = _judge(results, plan, cfg, reference, steps)
    if not quiet:
        print(f"train_3d OK on {plan.world_size} ranks ({_label(plan)}, {kind}): the "
              f"single-device loss at each of {steps} steps (largest gap {gap:.1e}); each replica "
              "ran its own rows; replicas, RMSNorm copies and tied embeddings agree")
    return {"losses": results[0]["losses"], "reference": reference, "gap": gap}
