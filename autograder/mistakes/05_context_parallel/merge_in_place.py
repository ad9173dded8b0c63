"""Mistake: merge rescales out_a and out_b in place (out_a.mul_(...)).

Replaces the exercise-1 answer, `merge`. The merged result is right, but the caller's
partial results now hold their weighted versions: a ring that merges the same accumulator
again, or a caller that keeps a partial, computes with wrong numbers. The check now
compares every input with a copy after the call (issue 16.6).
"""

import torch

CAUGHT_BY = {
    "check_merge": "your code modified its input out_a",
}


def merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    total = torch.where(total > 0, total, torch.ones_like(total))
    out_a.mul_((w_a / total)[..., None])  # wrong: rescales the caller's tensor
    out_b.mul_((w_b / total)[..., None])
    return out_a + out_b, lse
