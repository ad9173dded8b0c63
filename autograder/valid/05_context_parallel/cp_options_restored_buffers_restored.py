"""context_parallel with its defaults for the buffers (restored on exit, so the pieces that
require grad are detached aliases made inside the block), PyTorch's options imported inside
the function (the real object in the ranks), load balancing turned off and the earlier
setting put back in a `finally`, after the unshard (which reads the setting); the loss as
`(out * dout).sum()`, and the gradients unsharded after the block."""

PASSES = ["check_context_parallel"]


def cp_attention(q, k, v, dout, mesh):
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        _cp_options,
        context_parallel_unshard,
    )

    cp = mesh["cp"]
    T, W = q.shape[2], cp.size()
    if T % W != 0:
        raise ValueError(f"{W} CP ranks cannot share {T} tokens equally")
    before = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = False
    buffers = [q.clone(), k.clone(), v.clone(), dout.clone()]
    try:
        with context_parallel(cp, buffers=buffers, buffer_seq_dims=[2] * 4):
            qa, ka, va = (b.detach().requires_grad_() for b in buffers[:3])
            out = F.scaled_dot_product_attention(qa, ka, va, is_causal=False)
            (out * buffers[3]).sum().backward()
        return tuple(context_parallel_unshard(cp, [out.detach(), qa.grad, ka.grad, va.grad],
                                              [2] * 4))
    finally:
        _cp_options.enable_load_balance = before
