"""Mistake: the cross-entropy's backward ignores its incoming gradient (grad_output).

Right whenever the loss is differentiated as it is, where that gradient is 1; wrong as soon as
the loss is scaled, as module 08 scales each micro-batch's loss by 1/m before its backward:
the logits' gradient is then m times too large, and training takes steps m times too long.
The check differentiates the loss times a random scalar and times 1/8.

Replaces VocabParallelCrossEntropy and vocab_parallel_cross_entropy (exercise 8).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

CAUGHT_BY = {
    "check_vocab_cross_entropy": "the backward dropped its incoming gradient",
}


class VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_shard, target, vocab_size):
        rank = dist.get_rank()
        n = logits_shard.shape[-1]
        start = rank * n
        cols = torch.arange(start, start + n, device=logits_shard.device)
        x = logits_shard.masked_fill(cols >= vocab_size, float("-inf"))
        m = x.amax(dim=-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        x = x - m.unsqueeze(-1)
        outside = (target < start) | (target >= start + n)
        local = (target - start).masked_fill(outside, 0)
        picked = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked)
        e = x.exp()
        total = e.sum(dim=-1)
        dist.all_reduce(total)
        softmax = e / total.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, outside)
        return (total.log() - picked).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        onehot = F.one_hot(local, softmax.shape[-1]).to(softmax.dtype)
        onehot = onehot.masked_fill(outside.unsqueeze(-1), 0.0)
        return (softmax - onehot) / local.numel(), None, None  # wrong: grad never used


def vocab_parallel_cross_entropy(logits_shard, target, vocab_size):
    return VocabParallelCrossEntropy.apply(logits_shard, target, vocab_size)
