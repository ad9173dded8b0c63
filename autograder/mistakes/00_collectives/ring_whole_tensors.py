"""Mistake: the whole tensor passed around the ring instead of one chunk per step.

The values are right, but each rank sends (t-1) n bytes instead of 2(t-1)/t n: the same on
2 ranks (where swapping whole tensors costs what a ring does), more from 3 ranks on.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"hidden:ring_allreduce_test": "are you sending whole tensors"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    total, travelling = x.clone(), x.clone()
    for _ in range(t - 1):
        incoming = torch.empty_like(travelling)
        send = (dist.isend, travelling, (rank + 1) % t)  # wrong: all n bytes
        recv = (dist.irecv, incoming, (rank - 1) % t)
        posts = (send, recv) if rank % 2 == 0 else (recv, send)  # even ranks send first
        for req in [post(buf, peer) for post, buf, peer in posts]:
            req.wait()
        total += incoming
        travelling = incoming
    return total
