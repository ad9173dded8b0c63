"""Mistake: the cross-entropy computed outside the loss_parallel() context, only the backward
inside it.

F.cross_entropy on DTensor logits has no sharded rule outside the context, and a plain target
cannot meet them: PyTorch refuses ("nll_loss_forward.default got mixed torch.Tensor and
DTensor").
"""

import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel

CAUGHT_BY = {"check_torch_tp": "ran outside loss_parallel()"}


def tp_loss(logits, target):
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    with loss_parallel():
        loss.backward()
    return loss
