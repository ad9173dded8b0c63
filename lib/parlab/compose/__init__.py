"""The whole machine (module 08): the Llama trained over DP × PP × TP (+SP) × CP × EP.

    from parlab.compose import Plan, TOLERANCE, train, train_single
    from parlab.launch import run

    plan = Plan(dp=2, pp=2, tp=2, sequence_parallel=True)
    losses = run(train, 8, LlamaConfig(), plan, 6, lr=3e-3)[0]
    single = train_single(LlamaConfig(), 6, global_batch_size=8, lr=3e-3)   # |gap| <= TOLERANCE

or under torchrun with Megatron-LM's argument names: `scripts/train.py`.

- `grid`: `make_grid` (the rank grid of `parlab.mesh` and every group: tp, cp, pp, ep, dense
  dp = dp × ep × cp, expert_dp = dp × cp, embedding), `Grid`, `Positions`, `group_size`.
- `layer`: `ParallelBlock` (a Llama layer under TP, SP, CP), `ParallelAttention`,
  `ParallelSwiGLU`.
- `experts`: `ExpertParallelMoE` (SwiGLU experts over ep, dispatch over all_to_all_single),
  `gather_sequence`, `exchange_counts`.
- `stage`: `layer_costs`, `split_layers` (module 04's balancing), `Stage`, `ParallelLlama`
  (this rank's chunks, looped placement).
- `pipeline`: `run_schedule` (any `parlab.pp.make_schedule` schedule on the stages, the
  earlier backwards inside the DP syncs' `no_sync()`), `Messages`, `synced_backwards`.
- `grads`: `finalize_grads` (SP sums, tied embedding, DP mean), `data_parallel` and
  `bucketed` (the model's `parlab.dp.BucketedDDP`s, overlapped with the last backwards),
  `sync_data_parallel` (their `finish()`: the seam `Parts` can replace), `sum_grads`.
- `train`: `Plan`, `Parts` (the replaceable pieces tests plant bugs in), `TOLERANCE` and
  `CHECKED_STEPS` (how close, for how long), `check_plan`, `setup`, `train_step`, `train`,
  `train_single`, `rank_device`, `Replica`.
"""

from parlab.compose.experts import ExpertParallelMoE, exchange_counts, gather_sequence
from parlab.compose.grads import (
    BUCKET_BYTES,
    bucketed,
    data_parallel,
    finalize_grads,
    sum_grads,
    sync_data_parallel,
)
from parlab.compose.grid import Grid, Positions, group_size, make_grid
from parlab.compose.layer import ParallelAttention, ParallelBlock, ParallelSwiGLU
from parlab.compose.pipeline import Messages, run_schedule, synced_backwards
from parlab.compose.stage import ParallelLlama, Stage, layer_costs, split_layers
from parlab.compose.train import (
    CHECKED_STEPS,
    TOLERANCE,
    Parts,
    Plan,
    Replica,
    check_plan,
    rank_device,
    setup,
    train,
    train_single,
    train_step,
)

__all__ = [
    "Grid", "Positions", "make_grid", "group_size", "ParallelAttention", "ParallelSwiGLU",
    "ParallelBlock", "ExpertParallelMoE", "gather_sequence", "exchange_counts", "layer_costs",
    "split_layers", "Stage", "ParallelLlama", "Messages", "run_schedule", "synced_backwards",
    "BUCKET_BYTES", "bucketed", "data_parallel", "sync_data_parallel", "sum_grads",
    "finalize_grads", "TOLERANCE", "CHECKED_STEPS", "Plan", "Parts", "Replica", "check_plan",
    "rank_device", "setup", "train_step", "train", "train_single",
]
