"""Mistake: the model is never split over the TP group: every rank trains the whole GPT.

Without `TPBlock.from_block(block, group=tp_group)` for every block, the two TP ranks of a DP
replica run the same full model on the same rows. With the gradients averaged over DP the
losses still match the single device, so the check reads the work itself: no all-reduce of
activations ever runs over the TP group.

Replaces train_dp_tp (exercise 4).
"""

import torch.distributed as dist

from parlab.capstone import make_optimizer, record_progress
from parlab.model import GPT, batch, load_corpus

CAUGHT_BY = {"check_capstone": "the TP group all-reduced 0 activations"}


def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
    groups = build_groups({"dp": dp, "tp": tp})  # noqa: F821
    dp_rank = dist.get_rank() // tp
    model = GPT(cfg)  # wrong: the blocks stay whole, never TPBlock.from_block(...)
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
        sync_gradients(model, groups["dp"])  # noqa: F821
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=groups["dp"])
        losses.append(mean.item() / dp)
        if progress_file is not None and dist.get_rank() == 0:
            record_progress(progress_file, step, losses[-1])
    return losses
