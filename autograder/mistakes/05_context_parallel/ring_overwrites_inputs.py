"""Mistake: the received block copied into the caller's k and v (k.copy_(k_next)).

Replaces the exercise-2 answer, `ring_attention`. Every value is right, but after the call
this rank's k and v hold another rank's block: the caller has lost its own keys and values,
which the backward pass needs. The check now compares q, k, v and pos with copies after the
call (issue 16.6).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "your code modified its input k",
}


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32))
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=out.dtype)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends = [(dist.isend, k.clone(), (rank + 1) % W),
                     (dist.isend, v.clone(), (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank - 1) % W), (dist.irecv, v_next, (rank - 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends  # NCCL's order at W = 2
            pending = [post(t, peer) for post, t, peer in posts]
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k.copy_(k_next)  # wrong: writes into the caller's tensors
            v.copy_(v_next)
    return out.to(q.dtype), lse
