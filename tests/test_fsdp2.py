"""PyTorch's FSDP2 (`fully_shard`) beside the course's FSDP layer (module 01's "The same in
PyTorch"): what the tracer sees of it, which rows each rank holds, and its bytes per step.

Expected values are written out here from FSDP2's documented rule (each parameter split
along dim 0 with torch.chunk: ceil(rows/t) rows a rank, the last ranks fewer or none, each
shard padded to ceil(rows/t) rows for the all-gather), never read from parlab's output.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parlab import comm
from parlab.launch import run


def _keyword_calls() -> list[tuple[str, int, float]]:
    t = dist.get_world_size()
    full, shard = torch.ones(12 * t), torch.empty(12)
    with comm.trace() as tr:
        dist.all_gather_single(output_tensor=full, input_tensor=torch.ones(12))
        dist.reduce_scatter_single(output=shard, input=full)  # as FSDP2 calls it
        dist.reduce_scatter_tensor(output=shard, input=full)
    return [(e.kind, e.nbytes, e.wire_bytes) for e in tr.events]


@pytest.mark.parametrize("t", [2, 3])
def test_the_tracer_counts_calls_made_with_keyword_arguments(t: int) -> None:
    n = 12 * t * 4  # bytes of the full tensor: t shards of 12 float32
    want = (t - 1) / t * n
    for events in run(_keyword_calls, t):
        assert events == [("all_gather_single", n, pytest.approx(want)),
                          ("reduce_scatter_single", n, pytest.approx(want)),
                          ("reduce_scatter_tensor", n, pytest.approx(want))]
