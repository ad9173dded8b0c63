"""Composed grids of 4 and 8 ranks follow the single-device losses at every step.

4 ranks: TP2 × CP2 with SP (ring attention inside the TP attention, zigzag positions through
the rotary embeddings); the MoE variant with EP2 × TP2 + SP (each TP rank routes its own
tokens) and with EP2 × CP2 (capacity applied to sequences split over the CP ranks).
8 ranks: DP2 × PP2 × TP2 with SP under 1F1B and under interleaved 1F1B.
The helpers, steps and learning rate are tests/test_compose.py's.
"""

from __future__ import annotations

import pytest
from test_compose import DENSE, FULL, GRAD_TOL, MOE, gaps_to_single, run_jobs, worst_grad_error

from parlab.compose import TOLERANCE, Plan
from parlab.launch import run

FOUR = [
    ("TP2 x CP2 SP", DENSE, Plan(tp=2, cp=2, sequence_parallel=True, micro_batch_size=4)),
    ("MoE EP2 x TP2 SP", MOE, Plan(ep=2, tp=2, sequence_parallel=True, micro_batch_size=2)),
    ("MoE EP2 x CP2", MOE, Plan(ep=2, cp=2, layout="contiguous", micro_batch_size=2)),
]
EIGHT = [
    ("DP2 x PP2 x TP2 SP 1F1B", DENSE, Plan(dp=2, pp=2, tp=2, sequence_parallel=True,
                                           micro_batch_size=2)),
    ("DP2 x PP2 x TP2 SP interleaved", DENSE,
     Plan(dp=2, pp=2, tp=2, sequence_parallel=True, virtual=2, schedule="interleaved_1f1b",
          micro_batch_size=2)),
]


@pytest.fixture(scope="module")
def grids():
    four = run(run_jobs, 4, FOUR, timeout=300)
    eight = run(run_jobs, 8, EIGHT, timeout=300)
    return four, eight, {**gaps_to_single(four, FOUR), **gaps_to_single(eight, EIGHT)}


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("name", [job[0] for job in FOUR + EIGHT])
def test_composed_grids_follow_the_single_device_loss(grids, name):
    four, eight, gaps = grids
    assert max(gaps[name]) <= TOLERANCE, (name, gaps[name])
    cfg = next(job[1] for job in FOUR + EIGHT if job[0] == name)
    results = four if name in {job[0] for job in FOUR} else eight
    assert worst_grad_error(results, name, cfg) < GRAD_TOL, name  # step 0, every shard
    local = [r[name]["params"] for r in results]
    assert max(local) < FULL[cfg], (name, local)  # every rank holds a share, not a copy
