"""Mistake: the receive buffers made with torch.empty(k.shape): float32 for float64 blocks.

Replaces the exercise-2 answer, `ring_attention`. The neighbour sends float64 K and V, 8
bytes an element, into float32 buffers of 4: gloo cannot match the sizes, the receiving
process aborts (SIGABRT) and its peer reads "Connection reset by peer". The check now looks
at every point-to-point tensor before the exchange and names the dtype (issue 16.7).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "torch.empty(shape) is float32 whatever k's dtype",
}


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = torch.empty(k.shape), torch.empty(v.shape)  # wrong: float32
            sends = [(dist.isend, k, (rank + 1) % W), (dist.isend, v, (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank - 1) % W), (dist.irecv, v_next, (rank - 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k, v = k_next, v_next
    return out.to(q.dtype), lse
