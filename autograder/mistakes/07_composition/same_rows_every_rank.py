"""Mistake: every DP rank trains on the same rows, 0 to batch_size/dp, of each global batch.

Data parallelism splits the batch: DP rank r takes rows r·b to (r+1)·b, b = batch_size/dp
(the two TP ranks of one replica take the same rows). With every replica on the first b rows,
half of each batch is never seen and the loss leaves the single-device curve at step 0.

Replaces train_dp_tp (exercise 4).
"""

import torch.distributed as dist
from torch import nn

from parlab.capstone import make_optimizer, record_progress
from parlab.model import GPT, batch, load_corpus
from parlab.tp import TPBlock

CAUGHT_BY = {"check_capstone": "both DP ranks on the same rows"}


def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
    groups = build_groups({"dp": dp, "tp": tp})  # noqa: F821
    model = GPT(cfg)
    model.blocks = nn.ModuleList(TPBlock.from_block(blk, group=groups["tp"])
                                 for blk in model.blocks)
    opt = make_optimizer(model, lr)
    tokens, _ = load_corpus()
    rows = slice(0, batch_size // dp)  # wrong: the same rows on every DP rank
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
