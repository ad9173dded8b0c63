"""Mistake: the next block received from the right neighbour, the one the block is sent to.

Replaces the exercise-2 answer, `ring_attention`. On 2 ranks the left and the right
neighbour are the same rank and the ring is right; from 3 ranks on, rank r waits for a block
from rank r + 1, which sends only to rank r + 2: nobody ever sends it. The check runs the
ring on 3 and 4 ranks too (issue 16.1) and stops the receive before it is made, naming the
direction, instead of reporting a hang (issue 16.8).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "the blocks travel from rank r to rank r + 1",
}
WORLD_SIZES = (3, 4)  # right on 2 ranks, where both neighbours are one rank


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends = [(dist.isend, k, (rank + 1) % W), (dist.isend, v, (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank + 1) % W),  # wrong: the right neighbour
                     (dist.irecv, v_next, (rank + 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k, v = k_next, v_next
    return out.to(q.dtype), lse
