"""torchtitan's way: `_cp_options` and `context_parallel_unshard` imported by name at the top
of the cell, load balancing switched off on that name in the function. A notebook's function
reaches the ranks by value, with a copy of every object it names; the check ships PyTorch's
options as the ranks' own (parlab.cp.torch_cp.share_cp_options), as a script under torchrun
would have them, so the switch reaches context_parallel."""

import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard

PASSES = ["check_context_parallel"]


def cp_attention(q, k, v, dout, mesh):
    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("T must be a multiple of the CP group's size")
    _cp_options.enable_load_balance = False
    pieces = [t.detach().clone() for t in (q, k, v, dout)]
    with context_parallel(cp, buffers=pieces, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(pieces)):
        q_, k_, v_, dout_ = pieces
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout_)
        return tuple(context_parallel_unshard(
            cp, [out.detach(), q_.grad, k_.grad, v_.grad], [2, 2, 2, 2]))
