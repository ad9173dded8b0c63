"""Only the DP replicas are treated as copies: the CP ranks of a pipeline stage hold the same
weights (context parallelism splits the sequence, not the model) and each adds its squares,
so on a grid with CP the norm comes out too large. Right on every grid without CP."""

CAUGHT_BY = {"check_clip_grad_norm": "every piece counted on each of the 2 DP x CP replicas"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if c["dp"] == 0 and not copy:  # the mistake: the cp replicas are copies too
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
