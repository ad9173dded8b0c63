"""Mistake: the all-gather concatenates the shards along dim 0, the batch, not the sequence.

Activations are (B, T, C): batch first, so the sequence is dim 1 (Megatron's own layout is
(T, B, C), where it is dim 0). torch.cat(parts) with no dim joins the ranks' shards into a
(t*B, T/t, C) tensor: t times the sequences, each still T/t tokens long.

Replaces all_gather_sequence (exercise 1); the autograd functions and everything built on
them pick it up.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_pair": "the sequence is dim 1",
    "check_sp_block": "the sequence is dim 1",
}


def all_gather_sequence(x):
    t = dist.get_world_size()
    parts = [torch.empty_like(x) for _ in range(t)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)  # wrong: dim 0 is the batch
