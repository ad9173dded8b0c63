"""sp_dropout with this rank's rows of the whole mask taken by narrow and cloned, and the
output written as torch.where(keep, x / (1 - p), 0) instead of x * keep / (1 - p): the same
numbers (a kept element is x / (1 - p) either way), the bool mask all that is saved."""

PASSES = ["check_sp_dropout"]


def sp_dropout(x, p_drop, generator):
    rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
    B, n, C = x.shape
    whole = torch.rand((B, t * n, C), generator=generator) >= p_drop  # noqa: F821
    keep = whole.narrow(1, rank * n, n).clone().to(x.device)
    return torch.where(keep, x / (1 - p_drop), torch.zeros((), dtype=x.dtype,  # noqa: F821
                                                           device=x.device))
