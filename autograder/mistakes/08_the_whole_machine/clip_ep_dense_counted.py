"""The dense tensors of an MoE model (spec.ep_dim is None: attention, norms, the router)
are counted on every EP rank, although each EP rank holds the same copy of them: on a grid
with EP the norm comes out too large. Right on every grid without EP."""

CAUGHT_BY = {"check_clip_grad_norm": "counted on each of the 2 ep ranks"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        copy = (s.tp_dim is None and c["tp"] != 0) or s.tied_copy  # the mistake: no ep_dim
        if c["dp"] == 0 and c["cp"] == 0 and not copy:
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
