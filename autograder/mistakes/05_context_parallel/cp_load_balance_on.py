"""Mistake: load balancing left on (PyTorch's default) for attention without a causal mask.

Replaces exercise 7's `cp_attention`. Right values on a CPU, where DTensor all-gathers K and
V and `context_parallel_unshard` undoes the reordering; on CUDA the ring refuses it:
`RuntimeError: Load balancing requires is_causal=True.` (the tutorial's example is causal, so
it never turns the option off).
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "RuntimeError('Load balancing requires `is_causal=True`.')",
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
        return tuple(_attention.context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
