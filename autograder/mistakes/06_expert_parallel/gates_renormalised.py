"""Mistake: the softmax is taken over the k chosen logits only.

Picking the top-k logits first and normalising them makes the gates of each token sum to 1:
a different router (Mixtral's) from the one the notebook states, whose gates are the full
softmax's probabilities of the chosen experts.

Replaces router (exercise 1).
"""

import torch

CAUGHT_BY = {"check_router": "a softmax over the k chosen logits renormalises them"}


def router(x, weight, k):
    logits = x @ weight.t()
    top, experts = logits.topk(k, dim=-1)
    gates = torch.softmax(top, dim=-1)  # wrong: over the k chosen only
    probs = torch.softmax(logits, dim=-1)
    e = weight.shape[0]
    f = torch.bincount(experts.flatten(), minlength=e).to(probs.dtype) / experts.numel()
    return gates, experts, e * (f * probs.mean(dim=0)).sum()
