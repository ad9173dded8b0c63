"""FSDPLinearFunction's backward computed by autograd instead of by hand: the gathered weight
and bias become leaves of a small graph, F.linear runs again under enable_grad, and
torch.autograd.grad gives the three gradients. Still only x and the shard saved, the weights
refetched in backward, one all-gather and one reduce-scatter there."""

PASSES = ["check_fsdp_layer"]


class FSDPLinearFunction(torch.autograd.Function):  # noqa: F821
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.dims = (out_features, in_features)
        flat = all_gather_flat(shard)  # noqa: F821
        weight, bias = flat.split([out_features * in_features, out_features])
        ctx.save_for_backward(x, shard)
        return F.linear(x, weight.view(out_features, in_features), bias)  # noqa: F821

    @staticmethod
    def backward(ctx, grad_y):
        out_features, in_features = ctx.dims
        x, shard = ctx.saved_tensors
        flat = all_gather_flat(shard).detach().requires_grad_()  # noqa: F821
        x = x.detach().requires_grad_()
        with torch.enable_grad():  # noqa: F821
            weight, bias = flat.split([out_features * in_features, out_features])
            y = F.linear(x, weight.view(out_features, in_features), bias)  # noqa: F821
            grad_x, grad_flat = torch.autograd.grad(y, (x, flat), grad_y)  # noqa: F821
        return grad_x, reduce_scatter_flat(grad_flat), None, None  # noqa: F821
