"""Mistake: the vocabulary-parallel table keeps V // t rows per rank, as if t divided V.

With V = 37 on 2 ranks each rank keeps 18 rows and id 36 belongs to nobody. Megatron-LM pads
the vocabulary to a multiple of t instead (t * ceil(V / t) rows; here the extra ones are zero).

Replaces VocabParallelEmbedding (exercise 7); g is the learner's.
"""

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_embedding": "pad the table to t * ceil(V / t) rows",
}


class VocabParallelEmbedding(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        n = embedding.weight.shape[0] // t  # wrong: floor, the last ids are dropped
        self.start, self.end = rank * n, (rank + 1) * n
        self.weight = nn.Parameter(embedding.weight.detach()[self.start:self.end].clone())

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return g(out)  # noqa: F821
