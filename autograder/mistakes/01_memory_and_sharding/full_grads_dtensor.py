"""Mistake: p.grad returned as it is.

FSDP2's gradients are DTensors (this rank's Shard(0) piece, wrapped): comparing one with a
plain tensor, or saving it as the whole gradient, is wrong. p.grad.full_tensor() all-gathers
the whole gradient.

Replaces full_grads (exercise 4).
"""

CAUGHT_BY = {"check_fully_shard": "FSDP2's gradients are DTensors"}


def full_grads(model):
    return {name: p.grad for name, p in model.named_parameters()}
