"""Mistake: the rows per rank written as V // t + 1 instead of ceil(V / t).

The two agree whenever t does not divide V (37 on 2 ranks: 19 rows each; on 3 ranks: 13), so
every table the check used to try on fewer than 4 ranks passed; with V = 36 on 2 ranks each rank
keeps 19 rows instead of 18, and rank 1's rows start one row late. The visible test now runs
V = 37 and V = 36.

Replaces VocabParallelEmbedding (exercise 7); g is the learner's.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_embedding": "not V // t + 1",
}


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        vocab, hidden = embedding.weight.shape
        n = vocab // t + 1  # wrong: ceil(V / t) only when t does not divide V
        self.start, self.end = rank * n, (rank + 1) * n
        rows = embedding.weight.detach()[self.start:self.end]
        padding = rows.new_zeros(n - rows.shape[0], hidden)
        self.weight = nn.Parameter(torch.cat([rows, padding]).clone())

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return g(out)  # noqa: F821
