"""Mistake: no ValueError when the CP group's size does not divide T.

Replaces exercise 7's `cp_attention`. context_parallel cuts T = 19 tokens on 3 ranks as
torch.chunk does, into 7, 7 and 5, and wraps each piece as if they were equal: the all-gather
in SDPA then mismatches (measured on gloo: a rank aborts with SIGABRT, or the ranks wait
until the timeout). The check refuses the uneven pieces at the SDPA call, before anything is
sent.
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "context_parallel cuts T into W equal pieces and cannot pad",
}


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    _attention._cp_options.enable_load_balance = False
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    with context_parallel(cp, buffers=pieces, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(pieces)):
        q_, k_, v_, dout_ = pieces
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout_)
        return tuple(_attention.context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
