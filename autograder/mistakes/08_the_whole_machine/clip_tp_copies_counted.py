"""The norm counts the tensors TP leaves whole (the RMSNorm weights; the embedding too when the
vocabulary is not split) on every TP rank: their squares are added t times, the norm is too
large and every rank clips too hard."""

CAUGHT_BY = {"check_clip_grad_norm": "counted on each of the 2 TP ranks"}


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    total = torch.zeros((), device=device())  # noqa: F821
    for s in specs:
        if c["dp"] == 0 and c["cp"] == 0 and not s.tied_copy \
                and not (s.ep_dim is None and c["ep"] != 0):  # the mistake: no tp_dim test
            total += s.param.grad.pow(2).sum()
    dist.all_reduce(total)  # noqa: F821
    total = total.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # noqa: F821
    for s in specs:
        s.param.grad.mul_(coef)
    return total
