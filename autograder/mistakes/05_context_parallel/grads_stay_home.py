"""Mistake: dk and dv accumulated locally instead of travelling with their K/V block.

Replaces the exercise-3 answer, `ring_attention_backward`. Each rank adds its queries' terms
for every block it meets into ONE dk (and dv) of its own, never passing them on: the sum mixes
terms of every block and misses the other ranks' queries. dq is right.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_backward": "dk and dv must travel round the ring with their K/V block",
}


def ring_attention_backward(q, k, v, out, lse, dout, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % W, (rank + 1) % W
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends = [(dist.isend, k, right), (dist.isend, v, right)]
            recvs = [(dist.irecv, k_next, left), (dist.irecv, v_next, left)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
        dq_b, dk_b, dv_b = block_attention_backward(  # noqa: F821
            q, k, v, out, lse, dout, pos[rank], pos[src], causal=causal)
        dq, dk, dv = dq + dq_b, dk + dk_b, dv + dv_b  # wrong: block src's terms kept here
        if step < W - 1:
            for p in pending:
                p.wait()
            k, v = k_next, v_next
    return dq, dk, dv
