"""Mistake: every rank makes a blocking send before its receive.

A blocking send waits for the receiver's recv, but every rank is in its own send: a deadlock.

Replaces ring_allreduce (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_ring_allreduce": "a send or receive never met its partner"}


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(x)
    dist.send(x, dst=(rank + 1) % t)  # wrong: every rank blocks here
    dist.recv(incoming, src=(rank - 1) % t)
    return x + incoming
