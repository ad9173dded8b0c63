r"""Module 07 capstone: train the tiny GPT with DP × TP and get the single-device loss curve.

    from parlab.capstone import TOLERANCE, plot_losses, run_capstone, train_single

    single = train_single(GPTConfig(), 30, batch_size=8, lr=3e-3)
    parallel = run_capstone(GPTConfig(), 30, dp=2, tp=2, batch_size=8, lr=3e-3)  # 4 ranks
    plot_losses(single, parallel, tol=TOLERANCE)

or on real ranks: `torchrun --standalone --nproc-per-node 4 scripts/capstone.py --check`.

The ranks form a grid `parlab.mesh.make_mesh(dp·tp, dp=dp, tp=tp)`, TP innermost: with
dp = tp = 2, ranks {0, 1} and {2, 3} are TP groups, {0, 2} and {1, 3} DP groups. Every rank
builds the same seeded GPT, then each step runs the pieces below, each small enough to write
by hand:

1. `shard_model`: every `Block` becomes its `TPBlock` (heads and MLP split over the TP group);
   embeddings, LayerNorms and head stay replicated. Done once.
2. `parlab.model.batch`: the global batch of the step, the same on every rank.
3. `local_batch`: this DP rank's batch_size/dp rows. Both ranks of a TP group take the SAME
   rows: TP splits the weights, not the data.
4. forward, loss (mean over the local rows), backward. TP's f/g all-reduces happen inside.
5. `sync_gradients`: average every gradient over the DP group. The mean over dp equal-sized
   shards of the per-shard means is the mean over the whole batch, so the averaged gradient
   is the single-device one: $\frac{1}{d}\sum_r \nabla \bar L_r = \nabla \bar L$.
6. AdamW step. Adam is element-wise, so stepping each TP shard is stepping the full tensor.

Every gradient is then the single-device gradient up to float rounding, and so is every step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab import launch
from parlab.mesh import make_mesh, new_groups
from parlab.model.corpus import batch, load_corpus
from parlab.model.gpt import GPT, GPTConfig
from parlab.model.transformer import Block
from parlab.tp.attention import TPBlock

__all__ = ["TOLERANCE", "check_plan", "shard_model", "local_batch", "sync_gradients",
           "Replica", "setup_parallel", "train_step", "train_parallel", "train_single",
           "make_optimizer", "record_progress"]

# Largest |parallel loss - single-device loss| accepted at any step (float32, losses ~2-6).
# Not bit-exact: a TP rank sums half of each matmul's products and an all-reduce adds the
# halves, the DP average adds two half-batch gradients, and gloo/NCCL choose their own order
# of additions; float32 addition is not associative, so results differ in the last bits.
# Measured on CPU (defaults, batch 8, lr 3e-3): at most 9.5e-7 (two float32 ulps of the loss)
# at every one of 100 steps. Real bugs are 65x or more above 1e-4 at their first wrong step:
# no gradient sync 1.5e-2 (step 1), every DP rank on the same rows 6.7e-3 (step 0). Summing
# instead of averaging gradients does NOT show in the loss: Adam divides each gradient by its
# own running size, so 2x the gradient is nearly the same step (1.2e-5 after 100 steps); the
# gradients themselves are off by 100% (tests/test_capstone.py checks them too).
# On a GPU: TF32 is off in the ranks (launch.devices.pin_numerics), so only summation order
# differs, as on the CPU (parlab.compose.train.TOLERANCE says more).
TOLERANCE = 1e-4


def check_plan(cfg: GPTConfig, *, dp: int, tp: int, batch_size: int,
               world_size: int | None = None) -> None:
    """Raise ValueError, saying what to change, when these sizes cannot train together."""
    for name, n in (("dp", dp), ("tp", tp), ("batch_size", batch_size)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}={n!r} must be a positive integer")
    if world_size is not None and dp * tp != world_size:
        raise ValueError(f"dp × tp = {dp} × {tp} = {dp * tp} ranks, but {world_size} ranks "
                         f"are running: start dp·tp ranks, or choose dp and tp whose product "
                         f"is {world_size}")
    if cfg.heads % tp:
        raise ValueError(f"cfg.heads={cfg.heads} is not divisible by tp={tp}: each TP rank "
                         f"runs whole heads; use a tp that divides {cfg.heads}")
    if batch_size % dp:
        raise ValueError(f"batch_size={batch_size} is not divisible by dp={dp}: each DP rank "
                         f"takes batch_size/dp rows; use a multiple of {dp}")
    words = len(load_corpus()[1])
    if cfg.vocab < words:
        raise ValueError(f"cfg.vocab={cfg.vocab} but the corpus has {words} words: "
                         f"use GPTConfig(vocab={words}) or more")


def _block(module: nn.Module) -> Block:
    if not isinstance(module, Block):
        raise TypeError(f"GPT.blocks holds a {type(module).__name__}, expected a Block")
    return module


def shard_model(model: GPT, tp_group: dist.ProcessGroup | None) -> nn.Module:
    """A copy of `model` whose blocks are this rank's `TPBlock`s; the rest is replicated."""
    sharded = copy.deepcopy(model)
    sharded.blocks = nn.ModuleList(TPBlock.from_block(_block(b), group=tp_group)
                                   for b in model.blocks)
    return sharded


def local_batch(x: Tensor, y: Tensor, dp_rank: int, dp: int) -> tuple[Tensor, Tensor]:
    """Rows dp_rank·b to (dp_rank+1)·b of the global batch, b = batch_size/dp."""
    b = x.shape[0] // dp
    rows = slice(dp_rank * b, (dp_rank + 1) * b)
    return x[rows], y[rows]  # (b, T), (b, T)


def sync_gradients(model: nn.Module, dp_group: dist.ProcessGroup | None) -> None:
    """Average every gradient over the DP group, as one flattened bucket (one all-reduce)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket = torch.cat([g.reshape(-1) for g in grads])  # (n_params,)
    dist.all_reduce(bucket, group=dp_group)
    bucket /= dist.get_world_size(dp_group)
    for g, part in zip(grads, bucket.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW with PyTorch's defaults except the learning rate (the same for both runs)."""
    if not lr > 0:
        raise ValueError(f"lr={lr!r} must be a positive learning rate, e.g. 3e-3")
    return torch.optim.AdamW(model.parameters(), lr=lr)


@dataclass
class Replica:
    """What one rank holds during training: its model shard, optimizer and groups."""

    model: nn.Module  # this rank's copy: TP shards of the blocks, the rest replicated
    optimizer: torch.optim.Optimizer
    groups: dict[str, dist.ProcessGroup]  # "dp" and "tp": this rank's process groups
    dp_rank: int  # which rows of every global batch are this rank's
    dp: int
    device: torch.device


def setup_parallel(cfg: GPTConfig, *, dp: int, tp: int, batch_size: int, lr: float,
                   shard_fn: Callable = shard_model) -> Replica:
    """Groups, seeded model, its shard and optimizer on this rank (every rank calls it)."""
    check_plan(cfg, dp=dp, tp=tp, batch_size=batch_size, world_size=dist.get_world_size())
    mesh = make_mesh(dp * tp, dp=dp, tp=tp)
    groups = new_groups(mesh, axes=("dp", "tp"))
    device = launch.device()
    model = shard_fn(GPT(cfg).to(device), groups["tp"])
    return Replica(model, make_optimizer(model, lr), groups,
                   mesh.coords(dist.get_rank())["dp"], dp, device)


def train_step(replica: Replica, x: Tensor, y: Tensor, *, batch_fn: Callable = local_batch,
               sync_fn: Callable = sync_gradients) -> float:
    """One step on the global batch x, y (B, T); the global mean loss (the same on every rank).

    The synced gradients stay in `.grad` until the next step, for checks to read.
    """
    x, y = (t.to(replica.device) for t in batch_fn(x, y, replica.dp_rank, replica.dp))
    replica.optimizer.zero_grad()
    loss = GPT.loss(replica.model(x), y)  # mean over this rank's (B/dp)·T tokens
    loss.backward()  # TP's all-reduces happen in here
    sync_fn(replica.model, replica.groups["dp"])
    replica.optimizer.step()
    return _dp_mean(loss.detach(), replica.groups["dp"])


def train_parallel(cfg: GPTConfig, steps: int, *, dp: int, tp: int, batch_size: int,
                   lr: float, progress_file: str | Path | None = None,
                   shard_fn: Callable = shard_model, batch_fn: Callable = local_batch,
                   sync_fn: Callable = sync_gradients) -> list[float]:
    """Train on this rank of a dp × tp grid; the global mean loss of every step.

    Call it on every rank inside an initialised process group of dp·tp ranks
    (`parlab.launch.run`, or torchrun). Every rank returns the same list. Rank 0 appends
    "<step> <loss>" to `progress_file` after every step. `shard_fn`, `batch_fn` and `sync_fn`
    replace steps 1, 3 and 5 (same signatures as shard_model, local_batch, sync_gradients).
    """
    replica = setup_parallel(cfg, dp=dp, tp=tp, batch_size=batch_size, lr=lr,
                             shard_fn=shard_fn)
    tokens, _ = load_corpus()
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
        losses.append(train_step(replica, x, y, batch_fn=batch_fn, sync_fn=sync_fn))
        if progress_file is not None and dist.get_rank() == 0:
            record_progress(progress_file, step, losses[-1])
    return losses


def train_single(cfg: GPTConfig, steps: int, *, batch_size: int, lr: float,
                 device: str | torch.device = "cpu") -> list[float]:
    """The reference: the same model, batches and optimizer on one device; loss per step."""
    check_plan(cfg, dp=1, tp=1, batch_size=batch_size)
    model = GPT(cfg).to(device)
    opt = make_optimizer(model, lr)
    tokens, _ = load_corpus()
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
        opt.zero_grad()
        loss = GPT.loss(model(x.to(device)), y.to(device))  # mean over B·T tokens
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _dp_mean(loss: Tensor, dp_group: dist.ProcessGroup | None) -> float:
    """The global batch's mean loss: the mean of the DP ranks' equal-sized shard means."""
    total = loss.reshape(1).clone()
    dist.all_reduce(total, group=dp_group)
    return total.item() / dist.get_world_size(dp_group)


def record_progress(path: str | Path, step: int, loss: float) -> None:
    """Append "<step> <loss>" to the progress file that run_capstone's bar polls (rank 0 only)."""
    with open(path, "a") as f:
        f.write(f"{step} {loss!r}\n")
