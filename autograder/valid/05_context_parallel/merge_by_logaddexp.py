"""The merge with torch.logaddexp for the merged lse (PyTorch's own max-shifted log of a sum
of exponentials, -inf when both blocks are fully masked), each block's weight exp(lse_b - lse)
in [0, 1], and a fully masked row's weights set to zero by torch.where instead of a shifted
total."""

PASSES = ["check_merge"]


def merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)  # noqa: F821  (B, H, n)
    empty = torch.isneginf(lse)  # noqa: F821  both blocks fully masked
    safe = torch.where(empty, torch.zeros_like(lse), lse)  # noqa: F821
    w_a = torch.where(empty, torch.zeros_like(lse), torch.exp(lse_a - safe))  # noqa: F821
    w_b = torch.where(empty, torch.zeros_like(lse), torch.exp(lse_b - safe))  # noqa: F821
    return w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b, lse
