"""Mistake: the all-gather phase adds the received chunk instead of copying it.

The finished chunks are complete sums; adding them onto a rank's own partial copy counts
some ranks twice.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce": "copy the received chunk"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    chunks = torch.tensor_split(out, t)
    right, left = (rank + 1) % t, (rank - 1) % t

    def exchange(send_index, recv_index):
        incoming = torch.empty_like(chunks[recv_index])
        send = (dist.isend, chunks[send_index].contiguous(), right)
        recv = (dist.irecv, incoming, left)
        posts = (send, recv) if rank % 2 == 0 else (recv, send)  # even ranks send first
        for req in [post(buf, peer) for post, buf, peer in posts]:
            req.wait()
        return incoming

    for s in range(t - 1):
        chunks[(rank - s - 1) % t].add_(exchange((rank - s) % t, (rank - s - 1) % t))
    for s in range(t - 1):
        chunks[(rank - s) % t].add_(exchange((rank + 1 - s) % t, (rank - s) % t))  # wrong
    return out
