r"""Train the Llama on any DP × PP × TP (+SP) × CP × EP grid, and on one device for reference.

    plan = Plan(dp=2, pp=2, tp=2, sequence_parallel=True, global_batch_size=8)
    losses = train(LlamaConfig(), plan, steps=6, lr=3e-3)    # on each of the 8 ranks
    single = train_single(LlamaConfig(), steps=6, global_batch_size=8, lr=3e-3)
    max(abs(a - b) for a, b in zip(losses, single)) <= TOLERANCE

Every rank builds the same seeded Llama and keeps its share (`ParallelLlama`). One step:

1. the global batch of the step (`parlab.model.batch`: a function of the step alone);
2. this replica's rows (`grid.batch_rows`), this CP rank's positions (`grid.positions`),
   cut into m = rows / micro_batch_size microbatches;
3. the schedule (`parlab.pp.make_schedule(plan.schedule, pp, m, v)`) on this rank's stages
   (`run_schedule`); TP, SP, CP and EP communicate inside the stages;
4. `finalize_grads`: the TP sums under SP, the tied embedding's sum, the DP mean;
5. AdamW (element-wise, so stepping each shard is stepping the whole tensor); with
   `Plan(distributed_optimizer=True)` (Megatron's --use-distributed-optimizer) ZeRO-1 instead
   (`parlab.dp.ZeRO1` over `grid.dp`: it reduce-scatters the gradients itself, so step 4
   skips the DP mean, steps Adam on its 1/d slice and all-gathers the weights);
6. the global mean loss: the last stage's sum over microbatches, shared over the pipeline and
   averaged over the dp × ep × cp ranks. The same number on every rank.

Which batch a step trains on is the run's data position (`Position.consumed_samples`), kept
apart from the step count so that a resumed run continues the data where it stopped;
`train(..., checkpoints=)` resumes from and saves checkpoints (`parlab.compose.checkpoint`).

The reference runs the whole batch on one device in one forward and backward. Planted bugs
for the tests come in through `Parts` (the split of layers, the two gradient syncs), never
through flags in this code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch
import torch.distributed as dist

from parlab import launch
from parlab.compose.grads import Sync, finalize_grads, sync_data_parallel
from parlab.compose.grid import Grid, group_size, make_grid
from parlab.compose.pipeline import run_schedule
from parlab.compose.stage import ParallelLlama, split_layers
from parlab.dp.zero1 import ZeRO1
from parlab.model.corpus import batch, load_corpus
from parlab.model.llama import Llama, LlamaConfig
from parlab.pp.schedules import make_schedule
from parlab.tp.sequence import allreduce_sequence_parallel_grads

__all__ = ["TOLERANCE", "CHECKED_STEPS", "Plan", "Parts", "Replica", "Position",
           "Checkpointing", "check_plan", "setup", "train_step", "train",
           "train_single"]

TOLERANCE = 2e-5
"""Largest |parallel loss - single-device loss| accepted at a step (float32, losses 4-6,
AdamW at lr 3e-3, the first `CHECKED_STEPS` steps).

Why not zero: each grid adds the same numbers in another order. A TP rank sums part of
every matmul and the all-reduce adds the parts; microbatches accumulate gradients one by
one; the DP mean adds the replicas'; ring attention merges blocks through log-sum-exps
instead of one softmax. Float32 addition is not associative, so each reordering moves a
result by about one rounding, ~1e-7 relative (a loss of 5 moves by 4.8e-7, one ulp).
Adam divides each gradient by its own running size, so a tiny gradient whose sign rounding
flips takes a full step the other way: differences grow with the steps. On one device,
accumulating 4 microbatches instead of one batch drifts from the whole batch by 3e-6 within
30 steps, 2e-5 by step 50 and 2e-4 by step 100 (and at lr 1e-2 already 2e-4 by step 6):
hence the step limit and the modest learning rate.

Measured over every grid of tests/test_compose*.py (4 steps; 1 to 8 ranks): the largest
gap is 1.4e-6 (TP2 × CP2 with SP), 2.9e-6 when run for 6 steps; the tolerance is 7x above
the latter. The planted bugs at their first wrong step: SP without the RMSNorm-gradient sum
7.1e-5 (step 1, 3.5x above), DP without its gradient sync 1.6e-2 (step 1), the stages in
the wrong order 6.9e-3 (step 0). A gradient off by a constant factor (summed instead of
averaged) hardly moves Adam's steps: the tests compare step 0's gradients too.

On a GPU: the ranks switch TF32 off (`parlab.launch.devices.pin_numerics`; TF32 keeps 10 bits
of mantissa, ~5e-4 relative per product, far above this tolerance), so float32 stays
float32. What remains is the order of additions, which changes there too (cuBLAS picks its
own split of a matmul's sums, NCCL adds a ring's chunks in its own order): the same ~1e-7
per rounding as on the CPU. These gaps were measured on CPU only; `make gpu-check` runs the
module-08 notebook, whose check holds every grid to this tolerance, under NCCL."""

CHECKED_STEPS = 40
"""Steps within which TOLERANCE holds (see above); later steps drift further apart."""


@dataclass(frozen=True)
class Plan:
    """How to lay the run over the ranks (world = dp·pp·tp·cp·ep), and the batch."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    """Experts over ep ranks, folded into data parallelism: Megatron's DP is dp·ep."""
    sequence_parallel: bool = False
    virtual: int = 1
    """Chunks (virtual stages) per pipeline rank: needs schedule "interleaved_1f1b" when > 1."""
    schedule: str = "1f1b"
    micro_batch_size: int = 1
    global_batch_size: int = 8
    layout: str = "zigzag"
    """Which positions a CP rank holds (`parlab.cp.LAYOUTS`); zigzag balances causal work."""
    distributed_optimizer: bool = False
    """ZeRO-1: Adam's moments sharded over the dp × cp ranks (`parlab.dp.ZeRO1`)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp * self.cp * self.ep


@dataclass(frozen=True)
class Parts:
    """The replaceable pieces of a run (tests plant bugs here): the stage split and the syncs."""

    split_layers: Callable[[LlamaConfig, int], list[list[int]]] = split_layers
    sync_sequence_parallel: Sync = allreduce_sequence_parallel_grads
    sync_data_parallel: Sync = sync_data_parallel


def _fail_unless(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_plan(cfg: LlamaConfig, plan: Plan, *, world_size: int | None = None) -> None:
    """Raise ValueError saying what to change when this plan cannot train this model."""
    if world_size is not None:
        _fail_unless(plan.world_size == world_size,
                     f"dp·pp·tp·cp·ep = {plan.world_size} ranks, but {world_size} are running")
    t, cp, seq = plan.tp, plan.cp, cfg.seq
    _fail_unless(cfg.heads % t == 0 and cfg.kv_heads % t == 0,
                 f"tp={t} must divide heads={cfg.heads} and kv_heads={cfg.kv_heads}")
    _fail_unless(cfg.ffn % t == 0, f"tp={t} must divide ffn={cfg.ffn}")
    _fail_unless(not cfg.moe_layers or cfg.experts % plan.ep == 0,
                 f"ep={plan.ep} must divide experts={cfg.experts}")
    _fail_unless(not cfg.moe_layers or t == 1 or plan.sequence_parallel,
                 "MoE layers with tp > 1 need sequence parallelism (as in Megatron)")
    parts = 2 * cp if plan.layout == "zigzag" else cp
    _fail_unless(seq % parts == 0, f"seq={seq} must split into {parts} parts for CP "
                 f"({plan.layout} layout)")
    _fail_unless(not plan.sequence_parallel or (seq // cp) % t == 0,
                 f"SP splits the {seq // cp} tokens of a CP rank over tp={t}: choose sizes "
                 "that divide")
    rows, left = divmod(plan.global_batch_size, plan.dp * plan.ep)
    _fail_unless(left == 0 and rows % plan.micro_batch_size == 0,
                 f"global batch {plan.global_batch_size} must split over dp·ep = "
                 f"{plan.dp * plan.ep} replicas into microbatches of {plan.micro_batch_size}")
    _fail_unless(cfg.layers >= plan.pp * plan.virtual,
                 f"{cfg.layers} layers cannot fill pp·v = {plan.pp * plan.virtual} stages")
    _fail_unless(plan.virtual == 1 or plan.schedule == "interleaved_1f1b",
                 f"virtual={plan.virtual} chunks need the interleaved_1f1b schedule")
    _fail_unless(not plan.distributed_optimizer or plan.ep == 1,
                 "the distributed optimizer here shards dense replicas only: with ep > 1 the "
                 "ranks of a DP group hold different experts (use ep=1 or plain Adam)")
    _fail_unless(cfg.vocab >= len(load_corpus()[1]), "cfg.vocab is smaller than the corpus")


@dataclass
class Replica:
    """What one rank holds while it trains."""

    cfg: LlamaConfig
    plan: Plan
    grid: Grid
    model: ParallelLlama
    optimizer: torch.optim.Optimizer | ZeRO1
    parts: Parts
    device: torch.device


@dataclass(frozen=True)
class Position:
    """How far a run is: iterations done and sequences consumed (Megatron's iteration and
    consumed_train_samples). The next batch is `batch(tokens, consumed_samples // global)`."""

    step: int = 0
    consumed_samples: int = 0

    def after(self, global_batch_size: int) -> Position:
        return Position(self.step + 1, self.consumed_samples + global_batch_size)


class Checkpointing(Protocol):
    """What `train` needs from a checkpointer (`parlab.compose.checkpoint.Checkpoints`)."""

    def resume(self, rep: Replica) -> Position: ...

    def after_step(self, rep: Replica, position: Position, *, last: bool) -> None: ...


def _no_sync(params: object, *, group: object = None) -> None:
    """ZeRO-1 reduce-scatters the gradients in its step: no DP all-reduce before it."""


def setup(cfg: LlamaConfig, plan: Plan, *, lr: float, parts: Parts = Parts()) -> Replica:
    """Groups, this rank's share of the seeded model, its optimizer (every rank calls it)."""
    check_plan(cfg, plan, world_size=dist.get_world_size())
    grid = make_grid(dp=plan.dp, pp=plan.pp, tp=plan.tp, cp=plan.cp, ep=plan.ep,
                     layout=plan.layout)
    device = launch.device()
    layers = parts.split_layers(cfg, plan.pp * plan.virtual)
    model = ParallelLlama(Llama(cfg), grid, layers,
                          sequence_parallel=plan.sequence_parallel).to(device)
    optimizer: torch.optim.Optimizer | ZeRO1
    if plan.distributed_optimizer:
        optimizer = ZeRO1(model.unique_parameters(), group=grid.dp, lr=lr)
        parts = replace(parts, sync_data_parallel=_no_sync)
    else:
        optimizer = torch.optim.AdamW(model.unique_parameters(), lr=lr)
    return Replica(cfg, plan, grid, model, optimizer, parts, device)


def train_step(rep: Replica, step: int, tokens: torch.Tensor) -> float:
    """One step on global batch number `step`; the global mean loss (the same on all ranks)."""
    cfg, plan, grid = rep.cfg, rep.plan, rep.grid
    x, y = batch(tokens, step, batch_size=plan.global_batch_size, seq=cfg.seq, seed=cfg.seed)
    pos = grid.positions(cfg.seq, sequence_parallel=plan.sequence_parallel, device=rep.device)
    rows = grid.batch_rows(plan.global_batch_size)
    x, y = x[rows][:, pos.cp.cpu()].to(rep.device), y[rows][:, pos.cp.cpu()].to(rep.device)
    inputs, targets = list(x.split(plan.micro_batch_size)), list(y.split(plan.micro_batch_size))
    schedule = make_schedule(plan.schedule, plan.pp, len(inputs), plan.virtual)
    shape = (plan.micro_batch_size, pos.sp.numel(), cfg.hidden)  # one message (b, n/t, C)
    rep.optimizer.zero_grad()  # set_to_none, AdamW's default and ZeRO1's only way
    loss = run_schedule(schedule, rep.model, grid, inputs=inputs, targets=targets, pos=pos,
                        shape=shape)
    finalize_grads(rep.model, grid, sync_sequence_parallel=rep.parts.sync_sequence_parallel,
                   sync_dp=rep.parts.sync_data_parallel)
    rep.optimizer.step()
    total = loss.detach().reshape(1).clone()
    dist.all_reduce(total, group=grid.pp)  # only the last stage's ranks hold a loss
    dist.all_reduce(total, group=grid.dp)
    return total.item() / group_size(grid.dp)


def train(cfg: LlamaConfig, plan: Plan, steps: int, *, lr: float, parts: Parts = Parts(),
          on_step: Callable[[int, float, float], None] | None = None,
          checkpoints: Checkpointing | None = None) -> list[float]:
    """Train on this rank of the grid up to `steps` iterations; the global mean loss of every
    step it ran (on every rank).

    on_step(step, loss, seconds) is called after every step (the script's progress bar).
    checkpoints: resume from its last checkpoint (the losses then start at that step) and let
    it save after every step it chooses."""
    rep = setup(cfg, plan, lr=lr, parts=parts)
    tokens, _ = load_corpus()
    position = checkpoints.resume(rep) if checkpoints is not None else Position()
    losses = []
    while position.step < steps:
        start = time.perf_counter()
        index, left = divmod(position.consumed_samples, plan.global_batch_size)
        _fail_unless(left == 0, f"{position.consumed_samples} sequences consumed is not a "
                     f"whole number of global batches of {plan.global_batch_size}")
        losses.append(train_step(rep, index, tokens))
        if on_step is not None:
            on_step(position.step, losses[-1], time.perf_counter() - start)
        position = position.after(plan.global_batch_size)
        if checkpoints is not None:
            checkpoints.after_step(rep, position, last=position.step == steps)
    return losses


def train_single(cfg: LlamaConfig, steps: int, *, global_batch_size: int, lr: float,
                 device: str | torch.device = "cpu") -> list[float]:
    """The reference: the whole batch on one device, one forward and backward per step."""
    model = Llama(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    tokens, _ = load_corpus()
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=global_batch_size, seq=cfg.seq, seed=cfg.seed)
        optimizer.zero_grad(set_to_none=True)
        loss = Llama.loss(model(x.to(device)), y.to(device))  # mean over B·T tokens
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
