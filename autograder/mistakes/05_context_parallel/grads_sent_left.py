"""Mistake: backward passes the dk, dv accumulators to the left neighbour, against K and V.

Replaces the exercise-3 answer, `ring_attention_backward`. The accumulators must travel with
their block, from rank r to rank r + 1; sent the other way they arrive where that block is
not. On 2 ranks left and right are one rank and the answer is right; from 3 ranks on the
check stops the send before it is made and names the direction (issues 16.1 and 16.8).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_backward": "the blocks travel from rank r to rank r + 1",
}
WORLD_SIZES = (3, 4)  # right on 2 ranks, where both neighbours are one rank


def ring_attention_backward(q, k, v, out, lse, dout, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % W, (rank + 1) % W

    def shift(sends, recvs):  # even ranks post their sends first: NCCL's order at W = 2
        posts = sends + recvs if rank % 2 == 0 else recvs + sends
        return [post(t, peer) for post, t, peer in posts]

    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            pending = shift([(dist.isend, k, right), (dist.isend, v, right)],
                            [(dist.irecv, k_next, left), (dist.irecv, v_next, left)])
        dq_b, dk_b, dv_b = block_attention_backward(  # noqa: F821
            q, k, v, out, lse, dout, pos[rank], pos[src], causal=causal)
        dq = dq + dq_b
        dk, dv = dk + dk_b, dv + dv_b
        dk_in, dv_in = torch.empty_like(dk), torch.empty_like(dv)
        passed = shift([(dist.isend, dk, left), (dist.isend, dv, left)],  # wrong way
                       [(dist.irecv, dk_in, right), (dist.irecv, dv_in, right)])
        for handle in passed:
            handle.wait()
        dk, dv = dk_in, dv_in
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k, v = k_next, v_next
    return dq, dk, dv
