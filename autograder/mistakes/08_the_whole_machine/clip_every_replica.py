"""Every DP replica adds its squares to the world's sum: with d replicas holding equal
gradients the norm comes out sqrt(d) times too large."""

CAUGHT_BY = {"check_clip_grad_norm": "every piece counted on each of the 2 DP x CP replicas"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if not copy:  # the mistake: no dp == cp == 0 test
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
