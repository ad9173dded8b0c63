"""Mistake: the loss all-gathers the logits and calls F.cross_entropy on the whole of them.

The values and the gradients are right: autograd routes the gradient of the gathered tensor
back to this rank's own columns. But every rank receives and holds all b·s·V logits, the
memory and bytes the vocabulary split was meant to save (about 4 GB per micro-batch at Llama
3's sizes); the check refuses it for the bytes it sends.

Replaces vocab_parallel_cross_entropy (exercise 8).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_cross_entropy": "not their logits",
}


def vocab_parallel_cross_entropy(logits_shard, target, vocab_size):
    rank, t = dist.get_rank(), dist.get_world_size()
    parts = [torch.empty_like(logits_shard) for _ in range(t)]
    dist.all_gather(parts, logits_shard.detach().contiguous())  # wrong: every rank's logits
    parts[rank] = logits_shard  # autograd reaches this rank's own columns
    full = torch.cat(parts, dim=-1)[..., :vocab_size]
    return F.cross_entropy(full.reshape(-1, vocab_size), target.reshape(-1))
