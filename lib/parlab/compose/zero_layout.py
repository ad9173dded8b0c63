r"""ZeRO-1's flat slices <-> per-parameter chunks: the form a checkpoint can reshard.

    chunks = to_chunks(opt, opt_slice)      # this DP rank's dim-0 chunk of every parameter
    opt_slice = from_chunks(opt, chunks)    # and back (after loading on any other grid)

`parlab.dp.ZeRO1` flattens the parameters p_1..p_m of a rank into one vector of N numbers,
pads it to d·s (s = ceil(N/d)) and gives DP rank k the slice $S_k = [ks, (k+1)s)$ of it,
cutting through parameters wherever s falls. A slice boundary in the middle of a row of
wq is no shape a DTensor can describe, and it moves with every change of d or of the model.

The chunked form can: rank j holds, of every parameter (this rank's TP piece of it, rows
R_i), rows `chunk_rows(R_i, d, j)`: DTensor's `Shard(0)` over the d ranks. Both forms are
sets of positions in the same flat vector: the chunk rows of $p_i$ are the contiguous range
$T_{ij} = [o_i + a\,w_i, o_i + b\,w_i)$ ($o_i$ its offset, $w_i$ its row width), and rank j's
positions $T_j = \bigcup_i T_{ij}$, listed in increasing order. So one `all_to_all_single`
converts: rank k sends rank j the numbers of $S_k \cap T_j$, in order; rank j receives them
from k = 0, 1, ... in turn, and since the $S_k$ follow each other, what arrives is $T_j$ in
increasing order: its chunks, one after the other. Every rank computes all the split sizes
from the shapes alone; each number moves once (1/d of the moments per rank, no all-gather).
The reverse trip sends each rank its slice back; the padding past N is zero, as ZeRO1 keeps it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from parlab.compose.shards import chunk_rows
from parlab.dp.zero1 import ZeRO1

__all__ = ["chunk_positions", "to_chunks", "from_chunks"]


def _rows(p: Tensor) -> tuple[int, int]:
    """(rows, row width) of a parameter: dim 0 and the numbers in one index of it."""
    return (p.shape[0], p[0].numel()) if p.dim() else (1, 1)


def chunk_positions(opt: ZeRO1, j: int) -> list[tuple[int, int]]:
    """[start, stop) in the flat vector of DP rank j's chunk of each of opt's parameters."""
    out, offset = [], 0
    for p in opt.params:
        rows, width = _rows(p)
        a, b = chunk_rows(rows, opt.d, j)
        out.append((offset + a * width, offset + b * width))
        offset += p.numel()
    return out


def _positions(opt: ZeRO1, j: int, device: torch.device) -> Tensor:
    """T_j: DP rank j's flat positions, increasing (chunk of p_1, then of p_2, ...)."""
    ranges = [torch.arange(a, b, device=device) for a, b in chunk_positions(opt, j)]
    return torch.cat(ranges) if ranges else torch.empty(0, dtype=torch.long, device=device)


def _exchange(opt: ZeRO1, send: list[Tensor], recv_sizes: list[int], like: Tensor) -> Tensor:
    flat = torch.cat(send)
    out = like.new_empty(sum(recv_sizes))
    if opt.d == 1:
        return flat.clone()
    dist.all_to_all_single(out, flat, recv_sizes, [t.numel() for t in send], group=opt.group)
    return out


def _in_slice(pos: Tensor, k: int, shard: int) -> Tensor:
    return (pos >= k * shard) & (pos < (k + 1) * shard)


def to_chunks(opt: ZeRO1, values: Tensor) -> list[Tensor]:
    """values (s,): this rank's slice of a flat state (a moment) -> this rank's chunk of
    every parameter, shaped (rows, *p.shape[1:]), in opt.params order. Collective over
    opt.group."""
    lo, device = opt.rank * opt.shard, values.device
    send = []
    for j in range(opt.d):
        pos = _positions(opt, j, device)
        send.append(values[pos[_in_slice(pos, opt.rank, opt.shard)] - lo])
    mine = _positions(opt, opt.rank, device)
    recv = [int(_in_slice(mine, k, opt.shard).sum()) for k in range(opt.d)]
    flat = _exchange(opt, send, recv, values)  # T_mine in increasing order
    sizes = [b - a for a, b in chunk_positions(opt, opt.rank)]
    return [part.view(-1, *p.shape[1:]) if p.dim() else part.view(())
            for part, p in zip(flat.split(sizes), opt.params, strict=True)]


def from_chunks(opt: ZeRO1, chunks: list[Tensor]) -> Tensor:
    """The inverse of `to_chunks`: this rank's chunk of every parameter -> its slice (s,)
    of the flat state, zero past the last parameter. Collective over opt.group."""
    lo = opt.rank * opt.shard
    mine = torch.cat([c.reshape(-1) for c in chunks])  # T_mine in increasing order
    device = mine.device
    pos_mine = _positions(opt, opt.rank, device)
    send = [mine[_in_slice(pos_mine, k, opt.shard)] for k in range(opt.d)]
    where = []
    for j in range(opt.d):
        pos = _positions(opt, j, device)
        where.append(pos[_in_slice(pos, opt.rank, opt.shard)] - lo)
    flat = _exchange(opt, send, [w.numel() for w in where], mine)
    out = mine.new_zeros(opt.shard)
    out[torch.cat(where)] = flat
    return out
