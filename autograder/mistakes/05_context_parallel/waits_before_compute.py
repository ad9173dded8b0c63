"""Mistake: each transfer waited for before the block is computed: right values, no overlap.

Replaces the exercise-2 answer, `ring_attention`. The ring is correct, but every step first
ships the block and waits for it, then computes, so the time is compute plus every transfer.
The check sees block_attention called with no receive in flight.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "post the next block's transfer before computing the current one",
}


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        if step > 0:  # wrong: the transfer is waited for, nothing computes meanwhile
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends = [(dist.isend, k, (rank + 1) % W), (dist.isend, v, (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank - 1) % W), (dist.irecv, v_next, (rank - 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
            for p in pending:
                p.wait()
            k, v = k_next, v_next
        src = (rank - step) % W
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
    return out.to(q.dtype), lse
