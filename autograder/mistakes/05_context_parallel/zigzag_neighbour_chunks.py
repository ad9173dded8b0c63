"""Mistake: "zigzag" as two neighbouring chunks, 2r and 2r + 1, which is contiguous again.

Replaces the exercise-4 answer, `layout_positions`. The ranks still split the sequence, so the
ring still matches full attention, but rank W - 1 keeps the last quarter of the queries and
does (2W - 1) times the work of rank 0: the check compares the per-rank causal counts.
"""

import torch

CAUGHT_BY = {
    "check_layouts": "rank r holds chunk r and chunk 2W - 1 - r",
}


def layout_positions(layout, rank, world_size, seq_len):
    n = seq_len // world_size
    if layout == "contiguous":
        return torch.arange(rank * n, (rank + 1) * n)
    if layout == "striped":
        return torch.arange(rank, seq_len, world_size)
    m = n // 2
    return torch.cat([torch.arange(2 * rank * m, (2 * rank + 1) * m),  # wrong: chunk 2r
                      torch.arange((2 * rank + 1) * m, (2 * rank + 2) * m)])  # and 2r + 1
