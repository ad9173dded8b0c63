"""Mistake: load balancing left on (PyTorch's default) and the pieces gathered by a plain
all-gather, in rank order.

Replaces exercise 7's `cp_attention`. With T divisible by 2W, context_parallel reorders the
sequence before cutting it: rank r holds chunks r and 2W - 1 - r. `dist.all_gather` puts the
pieces back in rank order, so the output and the gradients come back with their tokens
shuffled. `context_parallel_unshard` would put them back in place.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel

CAUGHT_BY = {
    "check_context_parallel": "the tokens come back in context_parallel's load-balanced order",
}


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("T must be a multiple of the CP group's size")
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    with context_parallel(cp, buffers=pieces, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(pieces)):
        q_, k_, v_, dout_ = pieces
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout_)
    gathered = []
    for piece in (out.detach(), q_.grad, k_.grad, v_.grad):
        parts = [torch.empty_like(piece) for _ in range(cp.size())]
        dist.all_gather(parts, piece.contiguous(), group=cp.get_group())
        gathered.append(torch.cat(parts, dim=2))  # rank order
    return tuple(gathered)
