"""The global norm as Megatron-LM reduces it: within one replica only, over the grid's own
groups one after the other (grid.tp, then grid.pp, then grid.ep: together the pp × ep × tp
ranks of this dp, cp), so every DP x CP replica adds its own squares and computes the same
total without being masked out; the local squares as one torch.linalg.vector_norm of a flat
cat, and the coefficient as a Python float."""

PASSES = ["check_clip_grad_norm"]


def clip_grad_norm_(specs, max_norm, grid):
    c = grid.coords
    mine = [s.param.grad.flatten() for s in specs
            if not ((s.tp_dim is None and c["tp"]) or (s.ep_dim is None and c["ep"])
                    or s.tied_copy)]
    total = (torch.linalg.vector_norm(torch.cat(mine)).pow(2) if mine  # noqa: F821
             else torch.zeros((), device=device()))  # noqa: F821  (a rank may own nothing)
    for group in (grid.tp, grid.pp, grid.ep):
        dist.all_reduce(total, group=group)  # noqa: F821
    norm = total.sqrt()
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    for s in specs:
        s.param.grad.mul_(coef)
    return norm
