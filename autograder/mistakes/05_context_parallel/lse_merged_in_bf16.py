"""Mistake: the log-sum-exp merged in bf16 ("it is only a scale factor, bf16 will do").

Replaces the exercise-1 answer, `merge`; the learner's ring attention then merges with it too.
bf16 keeps 8 significant bits: an lse near 10 is rounded by up to 0.03, and every merge weight
exp(lse_a - lse) is off by up to 3%. The check recognises an lse that holds only bf16 values.
"""

import torch

CAUGHT_BY = {
    "check_merge": "the log-sum-exp has bf16 precision",
    "check_ring_forward": "the log-sum-exp has bf16 precision",
}


def merge(out_a, lse_a, out_b, lse_b):
    a, b = lse_a.bfloat16(), lse_b.bfloat16()  # wrong: 8 significant bits
    m = torch.maximum(a, b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a, w_b = torch.exp(a - m), torch.exp(b - m)
    total = w_a + w_b
    lse = m + torch.log(total)
    total = torch.where(total > 0, total, torch.ones_like(total))
    out = (w_a / total)[..., None].to(out_a.dtype) * out_a \
        + (w_b / total)[..., None].to(out_b.dtype) * out_b
    return out, lse.to(lse_a.dtype)
