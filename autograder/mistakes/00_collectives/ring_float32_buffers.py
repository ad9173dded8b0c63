"""Mistake: the receive buffers are made with torch.empty(n), float32 whatever x is.

Right for the visible float32 tests; for a float64 input the two ends of every message
disagree on the dtype (gloo aborts the exchange, "Connection reset by peer", or hands back
garbage). The check stops the first such call before it is sent.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce_float64": "torch.empty(n) and torch.zeros(n) are float32"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    chunks = torch.tensor_split(out, t)
    right, left = (rank + 1) % t, (rank - 1) % t

    def exchange(send_index, recv_index):
        incoming = torch.empty(chunks[recv_index].numel())  # wrong: float32 always
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
