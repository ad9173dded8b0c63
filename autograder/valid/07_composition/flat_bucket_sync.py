"""One bucket: every gradient flattened into one tensor, one all-reduce over the DP group,
the mean copied back into each .grad."""

PASSES = ['check_sync_gradients']


def sync_gradients(model, dp_group):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])  # noqa: F821
    dist.all_reduce(flat, group=dp_group)  # noqa: F821
    flat /= dist.get_world_size(dp_group)  # noqa: F821
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
