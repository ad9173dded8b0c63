"""The stage's sends and receives posted through dist.batch_isend_irecv (each a batch of one
P2POp, NCCL's grouped form), each receive waited on at once, each send's handle kept."""

PASSES = ["check_p2p_step"]


def _receive(ctx, peer):
    buffer = torch.empty(ctx.shape, dtype=ctx.dtype)  # noqa: F821
    for request in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buffer, peer)]):  # noqa: F821
        request.wait()
    return buffer


def _send(ctx, tensor, peer):
    ctx.sends += dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer)])  # noqa: F821


def forward_step(ctx, mb):
    x = ctx.inputs[mb] if ctx.is_first else _receive(ctx, ctx.prev_rank).requires_grad_()
    y = ctx.stage(x)
    if ctx.is_last:
        y = ctx.loss_fn(y, ctx.targets[mb]) / ctx.m
        ctx.losses.append(y.detach())
    else:
        _send(ctx, y.detach(), ctx.next_rank)
    ctx.saved[mb] = (x, y)


def backward_step(ctx, mb):
    x, y = ctx.saved.pop(mb)
    if ctx.is_last:
        y.backward()
    else:
        y.backward(_receive(ctx, ctx.next_rank))
    if not ctx.is_first:
        _send(ctx, x.grad, ctx.prev_rank)
