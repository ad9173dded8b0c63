"""The ring all-reduce with each step's send and receive posted together by
torch.distributed.batch_isend_irecv (what NCCL groups), on uneven chunks."""

PASSES = ['check_ring_allreduce']


def ring_allreduce(x):
    rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
    out = x.clone()
    if t == 1:
        return out
    chunks = torch.tensor_split(out, t)  # noqa: F821
    right, left = (rank + 1) % t, (rank - 1) % t

    def exchange(send_index, recv_index):
        incoming = torch.empty_like(chunks[recv_index])  # noqa: F821
        ops = [dist.P2POp(dist.isend, chunks[send_index].contiguous(), right),  # noqa: F821
               dist.P2POp(dist.irecv, incoming, left)]  # noqa: F821
        for request in dist.batch_isend_irecv(ops):  # noqa: F821
            request.wait()
        return incoming

    for s in range(t - 1):
        recv_index = (rank - s - 1) % t
        chunks[recv_index].add_(exchange((rank - s) % t, recv_index))
    for s in range(t - 1):
        recv_index = (rank - s) % t
        chunks[recv_index].copy_(exchange((rank + 1 - s) % t, recv_index))
    return out
