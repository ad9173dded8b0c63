"""Mistake: the ring works on views of x itself, so x is summed in place and returned.

The values are right, but the caller's x is gone: torch.tensor_split(x, t) returns views of x,
and adding into them changes x. The exercise asks for a new tensor, x unchanged.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce": "modified its input x in place"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(x, t)  # wrong: views of x, not of a copy
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
    return x
