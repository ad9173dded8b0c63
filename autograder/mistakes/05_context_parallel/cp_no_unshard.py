"""Mistake: this rank's pieces returned as they are, not gathered.

Replaces exercise 7's `cp_attention`. Inside the block the output and the gradients are
this rank's (B, H, T/W, D): `context_parallel_unshard` all-gathers them into the whole
sequence, in position order.
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "this rank's piece; expected the whole sequence",
}


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("T must be a multiple of the CP group's size")
    _attention._cp_options.enable_load_balance = False
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    with context_parallel(cp, buffers=pieces, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(pieces)):
        q_, k_, v_, dout_ = pieces
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout_)
        return out.detach(), q_.grad, k_.grad, v_.grad  # this rank's pieces
