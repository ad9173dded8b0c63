"""Mistake: the ring receives into buffers of the shape the check's first cases have.

Replaces the exercise-2 and exercise-3 answers, `ring_attention` and
`ring_attention_backward`: the next K/V block (and, backward, the dK/dV accumulators) are
received into torch.empty(1, 2, 6, 8), the (batch, heads, tokens per rank, head size) of the
check's first cases, instead of buffers made like k. Right for those cases; in the case of
other sizes (batch 2, 3 heads of 6, 4 tokens per rank) the buffer does not hold the block,
which the check stops before the exchange and names.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_ring_forward": "change from case to case, so never write them in",
    "check_ring_backward": "change from case to case, so never write them in",
}
SHAPE = (1, 2, 6, 8)  # wrong: the shape of k, which changes from case to case


def ring_attention(q, k, v, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    acc = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next = torch.empty(SHAPE, dtype=k.dtype, device=k.device)  # wrong: empty_like(k)
            v_next = torch.empty(SHAPE, dtype=v.dtype, device=v.device)
            sends = [(dist.isend, k, (rank + 1) % W), (dist.isend, v, (rank + 1) % W)]
            recvs = [(dist.irecv, k_next, (rank - 1) % W), (dist.irecv, v_next, (rank - 1) % W)]
            posts = sends + recvs if rank % 2 == 0 else recvs + sends
            pending = [post(t, peer) for post, t, peer in posts]
        part = block_attention(q, k, v, pos[rank], pos[src], causal=causal)  # noqa: F821
        out, lse = merge(out, lse, *part)  # noqa: F821
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k, v = k_next, v_next
    return out.to(q.dtype), lse


def ring_attention_backward(q, k, v, out, lse, dout, pos, *, causal):
    rank, W = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % W, (rank + 1) % W

    def shift(mine, into):
        sends = [lambda t=t: dist.isend(t, dst=right) for t in mine]
        recvs = [lambda t=t: dist.irecv(t, src=left) for t in into]
        posts = sends + recvs if rank % 2 == 0 else recvs + sends
        return [post() for post in posts]

    def buffer(like):
        return torch.empty(SHAPE, dtype=like.dtype, device=like.device)  # wrong: empty_like

    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for step in range(W):
        src = (rank - step) % W
        if step < W - 1:
            k_next, v_next = buffer(k), buffer(v)
            pending = shift([k, v], [k_next, v_next])
        dq_b, dk_b, dv_b = block_attention_backward(  # noqa: F821
            q, k, v, out, lse, dout, pos[rank], pos[src], causal=causal)
        dq = dq + dq_b
        dk, dv = dk + dk_b, dv + dv_b
        dk_in, dv_in = buffer(dk), buffer(dv)
        for handle in shift([dk, dv], [dk_in, dv_in]):
            handle.wait()
        dk, dv = dk_in, dv_in
        if step < W - 1:
            for handle in pending:
                handle.wait()
            k, v = k_next, v_next
    return dq, dk, dv
