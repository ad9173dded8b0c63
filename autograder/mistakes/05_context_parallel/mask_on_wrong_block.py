"""Mistake: the causal mask of every block built from the queries' own positions.

Replaces the exercise-2 answer, `ring_attention`. The K/V block held at step s came from rank
(r - s) % W, but the mask compares pos[r] with pos[r] (the diagonal block's mask, on every
block): keys that should be visible are hidden and the other way round. Non-causal attention is
right, which is how the check knows the mask is to blame.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "must use the positions of the rank it came from",
}


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends = [(dist.isend, k, (rank + 1) % W), (dist.isend, v, (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank - 1) % W), (dist.irecv, v_next, (rank - 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
        part = block_attention(q, k, v, pos[rank], pos[rank],  # noqa: F821 - wrong: pos[src]
                               causal=causal)
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            for p in pending:
                p.wait()
            k, v = k_next, v_next
    return out.to(q.dtype), lse
