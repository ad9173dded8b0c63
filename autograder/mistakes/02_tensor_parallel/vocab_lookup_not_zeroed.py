"""Mistake: the vocabulary-parallel lookup sends the ids of other ranks' rows to row 0 and
keeps what it finds there.

The mask is right and the ids are shifted, but the vectors of the ids outside [start, end)
are not zeroed, so the all-reduce adds t - 1 stray copies of the ranks' first rows to every
token. The gradient of each shard's row 0 is wrong the same way.

Replaces VocabParallelEmbedding (exercise 7); g is the learner's.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_embedding": "zero the vectors of the ids outside [start, end)",
}


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        vocab, hidden = embedding.weight.shape
        n = -(-vocab // t)
        self.start, self.end = rank * n, (rank + 1) * n
        rows = embedding.weight.detach()[self.start:self.end]
        self.weight = nn.Parameter(torch.cat([rows, rows.new_zeros(n - len(rows), hidden)]))

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        return g(F.embedding(local, self.weight))  # noqa: F821 - wrong: row 0 kept for others' ids
