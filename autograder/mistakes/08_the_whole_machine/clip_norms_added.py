"""Each rank takes the square root of its own sum and the ranks' norms are all-reduced: a
sum of norms, not the norm of the whole."""

CAUGHT_BY = {"check_clip_grad_norm": "add squares, not norms"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if c["dp"] == 0 and c["cp"] == 0 and not copy:
            total += s.param.grad.pow(2).sum()
    total = total.sqrt()  # the mistake: the root before the sum
    dist.all_reduce(total)  # noqa: F821
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
