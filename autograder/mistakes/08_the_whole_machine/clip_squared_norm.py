"""The square root is never taken: the sum of squares, all-reduced, is returned (and clipped
with) as if it were the norm."""

CAUGHT_BY = {"check_clip_grad_norm": "the squared norm"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if c["dp"] == 0 and c["cp"] == 0 and not copy:
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    # the mistake: no total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
