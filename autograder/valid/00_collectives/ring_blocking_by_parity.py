"""The ring all-reduce from blocking dist.send and dist.recv, which the exercise allows: even
ranks send first and odd ranks receive first, so that every blocking send meets a posted
receive (with an odd world size rank 0 and the last rank are both even: rank 0 sends to rank
1, which receives first, and the chain unwinds). In the all-gather phase each finished chunk
is received straight into its place in the output (a view of it), with no buffer to copy."""

PASSES = ["check_ring_allreduce"]


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
    out = x.clone()
    chunks = torch.tensor_split(out, t)  # noqa: F821
    right, left = (rank + 1) % t, (rank - 1) % t

    def exchange(outgoing, incoming):
        if rank % 2 == 0:
            dist.send(outgoing.contiguous(), dst=right)  # noqa: F821
            dist.recv(incoming, src=left)  # noqa: F821
        else:
            dist.recv(incoming, src=left)  # noqa: F821
            dist.send(outgoing.contiguous(), dst=right)  # noqa: F821

    for s in range(t - 1):  # reduce-scatter: receive into a buffer, then add
        recv_index = (rank - s - 1) % t
        incoming = torch.empty_like(chunks[recv_index])  # noqa: F821
        exchange(chunks[(rank - s) % t], incoming)
        chunks[recv_index].add_(incoming)
    for s in range(t - 1):  # all-gather: receive into the chunk itself
        exchange(chunks[(rank + 1 - s) % t], chunks[(rank - s) % t])
    return out
