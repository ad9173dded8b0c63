"""Mistake: the loop syncs the gradients inline, with a sum over DP instead of an average.

The all-reduce is over the right group but never divided by dp, so every gradient is d times
the single-device one. AdamW divides each gradient by its own running size, so the AdamW run
still follows the single-device losses; the visible test's second run uses plain SGD on DP 4,
where a gradient four times too large is a step four times too large (step 0's loss, before
any update, still matches).

Replaces train_dp_tp (exercise 4), without calling sync_gradients (whose own check would catch
the sum).
"""

import torch.distributed as dist
from torch import nn

from parlab.capstone import make_optimizer, record_progress
from parlab.model import GPT, batch, load_corpus
from parlab.tp import TPBlock

CAUGHT_BY = {"check_capstone": "under SGD a summed gradient makes every step d times"}


def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
    groups = build_groups({"dp": dp, "tp": tp})  # noqa: F821
    dp_rank = dist.get_rank() // tp
    model = GPT(cfg)
    model.blocks = nn.ModuleList(TPBlock.from_block(blk, group=groups["tp"])
                                 for blk in model.blocks)
    opt = make_optimizer(model, lr)
    tokens, _ = load_corpus()
    rows = slice(dp_rank * (batch_size // dp), (dp_rank + 1) * (batch_size // dp))
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
        x, y = x[rows], y[rows]
        opt.zero_grad()
        loss = GPT.loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=groups["dp"])  # wrong: never divided by dp
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=groups["dp"])
        losses.append(mean.item() / dp)
        if progress_file is not None and dist.get_rank() == 0:
            record_progress(progress_file, step, losses[-1])
    return losses
