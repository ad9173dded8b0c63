"""Mistake: the chunks are made with out.view(t, -1), which needs t to divide the length.

Right for the visible tests (1024 elements on 2 and 4 ranks); the hidden ones use 1001
elements on 3 ranks, and 3 on 4.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"hidden:ring_allreduce_test": "torch.tensor_split(x, t)"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    chunks = out.view(t, -1)  # wrong: only when t divides x.numel()
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
        chunks[(rank - s) % t].copy_(exchange((rank + 1 - s) % t, (rank - s) % t))
    return out
