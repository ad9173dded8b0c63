"""Mistake: the capacity queue is filled token by token (both choices of token 0, then of
token 1, ...), so a token's second choice can take the last slot of another token's first.

Replaces keep_mask (exercise 2).
"""

import torch

CAUGHT_BY = {"check_capacity": "serve the assignments choice first"}


def keep_mask(experts, num_experts, capacity):
    n, k = experts.shape
    seen = torch.zeros(num_experts, dtype=torch.int64)
    keep = torch.zeros(n, k, dtype=torch.bool)
    for i in range(n):  # wrong: token-major order
        for j in range(k):
            e = experts[i, j]
            keep[i, j] = bool(seen[e] < capacity)
            seen[e] += 1
    return keep
