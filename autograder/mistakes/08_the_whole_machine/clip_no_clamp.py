"""The coefficient max_norm / (norm + 1e-6) is not clamped at 1: below max_norm the gradients
are scaled up."""

CAUGHT_BY = {"check_clip_grad_norm": "clipping never scales up"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if c["dp"] == 0 and c["cp"] == 0 and not copy:
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    total = total.sqrt()
    coef = max_norm / (total + 1e-6)  # the mistake: no clamp at 1
    for s in specs:
        s.param.grad.mul_(coef)
    return total
