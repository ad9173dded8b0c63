"""Mistake: context_parallel over `mesh["dp"]`, the wrong dimension of a (dp, cp) mesh.

Replaces exercise 7's `cp_attention`. Right on a 1-D mesh, where there is no other
dimension (`WORLD_SIZES = (4,)`: the check's (2, 2) mesh). On the (dp, cp) mesh the pieces
are gathered from the ranks of the other replica, which hold another sequence: the keys of
two sequences mixed. The check sees the mesh context_parallel ran over.
"""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import _attention, context_parallel

CAUGHT_BY = {
    "check_context_parallel": "this rank's sequence is held by its CP group",
}
WORLD_SIZES = (4,)


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["dp"] if "dp" in mesh.mesh_dim_names else mesh["cp"]  # the wrong dimension
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
        return tuple(_attention.context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
