"""Mistake: the forward saves the gathered flat parameter for backward instead of the shard.

The step is right and the layer holds nothing afterwards, but the whole P-element parameter
lives from forward to backward (reshard_after_forward=False) and the backward's all-gather is
skipped: 2(d-1)/d * 4P bytes instead of 3(d-1)/d * 4P.

Replaces FSDPLinearFunction (exercise 2).
"""

import torch
import torch.nn.functional as F

CAUGHT_BY = {"check_fsdp_layer": "the backward reused the weight gathered in forward"}


class FSDPLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.dims = (out_features, in_features)
        flat = all_gather_flat(shard)  # noqa: F821 - the learner's exercise-2 helper
        weight = flat[:out_features * in_features].view(out_features, in_features)
        ctx.save_for_backward(x, flat)  # wrong: the gathered parameter, not the shard
        return F.linear(x, weight, flat[out_features * in_features:])

    @staticmethod
    def backward(ctx, grad_y):
        out_features, in_features = ctx.dims
        x, flat = ctx.saved_tensors
        weight = flat[:out_features * in_features].view(out_features, in_features)
        grad_flat = torch.cat([(grad_y.T @ x).flatten(), grad_y.sum(0)])
        return grad_y @ weight, reduce_scatter_flat(grad_flat), None, None  # noqa: F821
