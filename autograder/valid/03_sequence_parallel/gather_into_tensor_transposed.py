"""The sequence all-gather with dist.all_gather_into_tensor, which stacks along dim 0: the
shard is moved so that the sequence leads, gathered, and moved back. The check warns about
reshaping a dim-0 stack without moving the sequence; this answer moves it, and is right."""

PASSES = ["check_sp_pair"]


def all_gather_sequence(x):
    t = dist.get_world_size()  # noqa: F821
    shard = x.transpose(0, 1).contiguous()  # (T/t, B, C): the sequence first
    out = torch.empty((t * shard.shape[0], *shard.shape[1:]), dtype=x.dtype,  # noqa: F821
                      device=x.device)
    dist.all_gather_into_tensor(out, shard)  # noqa: F821  (T, B, C), rank 0's tokens first
    return out.transpose(0, 1).contiguous()  # (B, T, C)
