"""Mistake: the max shift without a finite fallback: nan when both blocks are fully masked.

Replaces the exercise-1 answer, `merge`. With lse_a = lse_b = -inf, m = max(lse_a, lse_b) is
-inf too and exp(lse_a - m) = exp(-inf - (-inf)) = exp(nan). The check compares the nan
with the reference's -inf and must say why, not crash on the comparison (issue 16.7).
"""

import torch

CAUGHT_BY = {
    "check_merge": "a fully masked block has lse = -inf and out = 0",
}


def merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)  # wrong: -inf when both blocks are fully masked
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    out = (w_a / total)[..., None] * out_a + (w_b / total)[..., None] * out_b
    return out, lse
