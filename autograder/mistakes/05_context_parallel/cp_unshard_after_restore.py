"""Mistake: load balancing turned off for the block, its earlier setting put back, then the
pieces unsharded.

Replaces exercise 7's `cp_attention`. `context_parallel_unshard` undoes a reordering only
if load balancing is on when it is called: it reads PyTorch's options then, not how the pieces
were cut. Here they were cut contiguous, and the unshard, with the default back on, reorders
them as if they were load-balanced: every result comes back shuffled.
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "reorders with the load-balancing setting in force when",
}


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("T must be a multiple of the CP group's size")
    before = _attention._cp_options.enable_load_balance
    _attention._cp_options.enable_load_balance = False
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    try:
        with context_parallel(cp, buffers=pieces, buffer_seq_dims=[2, 2, 2, 2],
                              no_restore_buffers=set(pieces)):
            q_, k_, v_, dout_ = pieces
            for t in (q_, k_, v_):
                t.requires_grad_()
            out = F.scaled_dot_product_attention(q_, k_, v_)
            out.backward(dout_)
    finally:
        _attention._cp_options.enable_load_balance = before  # back on before the unshard
    return tuple(_attention.context_parallel_unshard(
        cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
