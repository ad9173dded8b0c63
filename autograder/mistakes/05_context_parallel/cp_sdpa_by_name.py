"""Mistake: SDPA imported by name before context_parallel patches it.

Replaces exercise 7's `cp_attention`. context_parallel replaces the attribute
`torch.nn.functional.scaled_dot_product_attention` while its block is open; the name bound by
`from torch.nn.functional import scaled_dot_product_attention` is still the original, which
computes each rank's piece against its own keys only, with nothing sent.
"""

from torch.distributed.tensor.experimental import _attention, context_parallel
from torch.nn.functional import scaled_dot_product_attention

CAUGHT_BY = {
    "check_context_parallel": "no call of F.scaled_dot_product_attention was seen",
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
        out = scaled_dot_product_attention(q_, k_, v_)  # the unpatched function
        out.backward(dout_)
        return tuple(_attention.context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
