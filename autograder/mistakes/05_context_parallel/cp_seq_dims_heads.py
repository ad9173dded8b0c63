"""Mistake: `buffer_seq_dims=[1, 1, 1, 1]`: context_parallel cuts the heads, not the sequence.

Replaces exercise 7's `cp_attention`. Each rank keeps H/W heads of the whole sequence, which
the SDPA wrapper then declares to be a piece of the sequence (Shard(2)): the all-gathers
would return (B, H/W, W T, D), and on 3 ranks with 2 heads one rank gets no head at all and
the gathers mismatch. The check refuses it at the SDPA call, before anything is sent.
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "buffer_seq_dims names, for each buffer, the dimension",
}


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("T must be a multiple of the CP group's size")
    _attention._cp_options.enable_load_balance = False
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    with context_parallel(cp, buffers=pieces, buffer_seq_dims=[1, 1, 1, 1],  # the heads
                          no_restore_buffers=set(pieces)):
        q_, k_, v_, dout_ = pieces
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout_)
        return tuple(_attention.context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [1, 1, 1, 1]))
