"""Ulysses' two reshuffles with the list form dist.all_to_all and equal parts, which the
exercise allows: the W blocks to send as a list of contiguous tensors, received into a list
of empty_like buffers, then put in order with torch.cat."""

PASSES = ["check_ulysses"]


def seq_to_heads(x):
    W = dist.get_world_size()  # noqa: F821
    B, H, n, d = x.shape
    send = [part.contiguous() for part in x.chunk(W, dim=1)]  # block j: the heads of rank j
    recv = [torch.empty_like(part) for part in send]  # noqa: F821  block i: rank i's tokens
    dist.all_to_all(recv, send)  # noqa: F821
    return torch.cat(recv, dim=2)  # noqa: F821  (B, H/W, W n, d)


def heads_to_seq(y):
    W = dist.get_world_size()  # noqa: F821
    send = [part.contiguous() for part in y.chunk(W, dim=2)]  # block j: rank j's tokens
    recv = [torch.empty_like(part) for part in send]  # noqa: F821  block i: head block i
    dist.all_to_all(recv, send)  # noqa: F821
    return torch.cat(recv, dim=1)  # noqa: F821  (B, H, T/W, d)
