"""Only DP replica 0 counts (right), but the sums are all-reduced over grid.tp and grid.pp
only: the other replicas never receive the total and clip with a norm of 0."""

CAUGHT_BY = {"check_clip_grad_norm": "a rank that counts nothing"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if c["dp"] == 0 and c["cp"] == 0 and not copy:
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total, group=grid.tp)  # noqa: F821
    dist.all_reduce(total, group=grid.pp)  # noqa: F821  (the mistake: no DP reduction)
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
