"""Mistake: loss.backward() after the `with loss_parallel():` block, as one would write it
with an ordinary loss.

The forward is the parallel one; its backward, outside the context, is not, and PyTorch
refuses ("nll_loss_backward.default got mixed torch.Tensor and DTensor").
"""

import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel

CAUGHT_BY = {"check_torch_tp": "ran after the `with loss_parallel():` block closed"}


def tp_loss(logits, target):
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    loss.backward()
    return loss
