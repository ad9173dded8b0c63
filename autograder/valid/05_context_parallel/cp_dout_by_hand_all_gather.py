"""Load balancing off (so every piece is contiguous), only q, k and v given to
context_parallel; dout's piece cut by hand (`chunk`, this rank's index on the CP dimension),
and the four results gathered by `dist.all_gather_into_tensor` over the CP group, in rank
order, which is position order once the pieces are contiguous."""

PASSES = ["check_context_parallel"]


def cp_attention(q, k, v, dout, mesh):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import _attention, context_parallel

    cp = mesh["cp"]
    if q.shape[2] % cp.size():
        raise ValueError("the sequence does not split evenly over the CP group")
    _attention._cp_options.enable_load_balance = False
    q_, k_, v_ = (t.detach().clone() for t in (q, k, v))
    with context_parallel(cp, buffers=[q_, k_, v_], buffer_seq_dims=[2, 2, 2],
                          no_restore_buffers={q_, k_, v_}):
        for t in (q_, k_, v_):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q_, k_, v_)
        out.backward(dout.chunk(cp.size(), dim=2)[cp.get_local_rank()])
    gathered = []
    for piece in (out.detach(), q_.grad, k_.grad, v_.grad):
        rows = piece.movedim(2, 0).contiguous()  # (T/W, B, H, D): the tokens first
        whole = rows.new_empty((cp.size() * rows.shape[0], *rows.shape[1:]))
        dist.all_gather_into_tensor(whole, rows, group=cp.get_group())
        gathered.append(whole.movedim(0, 2))
    return tuple(gathered)
