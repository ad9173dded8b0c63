"""Mistake: only the reduce-scatter phase: each rank ends with one finished chunk.

After t-1 reduce-scatter steps rank r owns the complete sum of one chunk; the other chunks
still hold partial sums until the all-gather phase passes the finished ones around.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce": "did you skip the all-gather phase"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    chunks = torch.tensor_split(out, t)
    right, left = (rank + 1) % t, (rank - 1) % t
    for s in range(t - 1):
        recv_index = (rank - s - 1) % t
        incoming = torch.empty_like(chunks[recv_index])
        send = (dist.isend, chunks[(rank - s) % t].contiguous(), right)
        recv = (dist.irecv, incoming, left)
        posts = (send, recv) if rank % 2 == 0 else (recv, send)  # even ranks send first
        for req in [post(buf, peer) for post, buf, peer in posts]:
            req.wait()
        chunks[recv_index].add_(incoming)
    return out  # wrong: the all-gather phase is missing
