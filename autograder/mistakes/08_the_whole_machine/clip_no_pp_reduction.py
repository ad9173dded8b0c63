"""The sum of squares is all-reduced over the TP group only: each pipeline stage (and each DP
replica) ends with a norm of its own."""

CAUGHT_BY = {"check_clip_grad_norm": "add the pipeline stages' sums"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = ((s.tp_dim is None and c["tp"] != 0) or (s.ep_dim is None and c["ep"] != 0)
                or s.tied_copy)
        if not copy:
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total, group=grid.tp)  # noqa: F821  (the mistake: grid.pp never added)
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
