"""Mistake: the vocabulary-parallel lookup masks the ids of other ranks' rows but does not
subtract the shard's first row from its own.

Rank 0 is right (its first row is row 0); on every other rank an id of its own rows, at least
start, indexes past the n rows of the shard and F.embedding raises IndexError.

Replaces VocabParallelEmbedding (exercise 7); g is the learner's.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_embedding": "index the shard with ids - start",
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
        local = ids.masked_fill(outside, 0)  # wrong: not shifted by self.start
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return g(out)  # noqa: F821
