"""Mistake: a blocking recv posted before the send, on every rank: a deadlock.

Replaces the exercise-2 answer, `ring_attention`. Every rank waits in dist.recv for its left
neighbour's block, but that neighbour is waiting in its own dist.recv and never reaches its
send. The launcher stops the ranks at the check's timeout and the check says why.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "A blocking dist.recv (or dist.send) posted first on every rank",
}


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        src = (rank - step) % W
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            dist.recv(k_next, src=(rank - 1) % W)  # wrong: every rank blocks here first
            dist.recv(v_next, src=(rank - 1) % W)
            dist.send(k, dst=(rank + 1) % W)
            dist.send(v, dst=(rank + 1) % W)
            k, v = k_next, v_next
    return out.to(q.dtype), lse
