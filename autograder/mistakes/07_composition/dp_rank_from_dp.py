"""Mistake: this rank's DP coordinate is computed as rank // dp instead of rank // tp.

With TP innermost, rank = dp_rank · tp + tp_rank, so dp_rank = rank // tp. On DP 2 × TP 2 the
two are the same number; on DP 4 × TP 1 (the visible SGD run) rank // 4 is 0 on every rank, so
all four train on DP rank 0's rows, and the loss leaves the single-device curve at step 0 (on
DP 3 × TP 2, hidden, ranks 2 and 3 of one TP group get different rows).

Replaces train_dp_tp (exercise 4b); fails the visible DP 4 × TP 1 run.
"""

import torch.distributed as dist
from torch import nn

from parlab.capstone import make_optimizer, record_progress
from parlab.model import GPT, batch, load_corpus
from parlab.tp import TPBlock

CAUGHT_BY = {"check_capstone": "take every size from the arguments"}


def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
    groups = build_groups({"dp": dp, "tp": tp})  # noqa: F821
    dp_rank = dist.get_rank() // dp  # wrong: rank // tp (TP innermost)
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
        sync_gradients(model, groups["dp"])  # noqa: F821
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=groups["dp"])
        losses.append(mean.item() / dp)
        if progress_file is not None and dist.get_rank() == 0:
            record_progress(progress_file, step, losses[-1])
    return losses
