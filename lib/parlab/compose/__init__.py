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
  `train_single`, `Replica`, `Position` (iterations and the data position),
  `Checkpointing` (what `train(checkpoints=)` needs).
- `shards` (module 09): `ShardSpec`, `shard_specs` (which piece of which single-device tensor
  each parameter is), `rank_mesh`, `placements`, `as_dtensor`, `chunk_rows`, `reshard_pieces`
  (one tensor's t pieces to t' pieces, by their overlaps, as a DCP load reads them).
- `clip`: `clip_grad_norm_` (the single device's global gradient norm and clipping, each piece
  of each tensor counted once across TP, PP, EP and the dp·cp copies), `owns`.
- `zero_layout`: ZeRO-1's flat slices <-> per-parameter dim-0 chunks (`to_chunks`,
  `from_chunks`), the form a checkpoint reshards.
- `checkpoint`: `state_dict`, `save_state`, `load_state` (torch.distributed.checkpoint on any
  grid), `Saved`, `describe_grid`.
- `async_checkpoint`: `AsyncSaver` (`dcp.async_save` over a gloo group of its own: the loop
  waits for the copy to host memory, not for the write), `measure_save_stalls`, `state_bytes`.
- `resume`: `Checkpoints` (Megatron's --save / --save-interval / --load for `train`),
  `CheckpointParts` (planted bugs), `Resumed`, `latest`, `iteration_dir`.
"""

from parlab.compose.async_checkpoint import AsyncSaver, measure_save_stalls, state_bytes
from parlab.compose.checkpoint import (
    Saved,
    describe_grid,
    load_state,
    save_state,
    state_dict,
)
from parlab.compose.clip import clip_grad_norm_, owns
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
from parlab.compose.resume import (
    CheckpointParts,
    Checkpoints,
    Resumed,
    iteration_dir,
    latest,
)
from parlab.compose.shards import (
    ShardSpec,
    as_dtensor,
    chunk_rows,
    placements,
    rank_mesh,
    reshard_pieces,
    shard_specs,
)
from parlab.compose.stage import ParallelLlama, Stage, layer_costs, split_layers
from parlab.compose.train import (
    CHECKED_STEPS,
    TOLERANCE,
    Checkpointing,
    Parts,
    Plan,
    Position,
    Replica,
    check_plan,
    setup,
    train,
    train_single,
    train_step,
)
from parlab.compose.zero_layout import from_chunks, to_chunks

__all__ = [
    "Grid", "Positions", "make_grid", "group_size", "ParallelAttention", "ParallelSwiGLU",
    "ParallelBlock", "ExpertParallelMoE", "gather_sequence", "exchange_counts", "layer_costs",
    "split_layers", "Stage", "ParallelLlama", "Messages", "run_schedule", "synced_backwards",
    "BUCKET_BYTES", "bucketed", "data_parallel", "sync_data_parallel",
    "sum_grads", "finalize_grads", "TOLERANCE", "CHECKED_STEPS", "Plan", "Parts", "Replica",
    "check_plan", "setup", "train_step", "train", "train_single", "Position",
    "Checkpointing", "ShardSpec", "shard_specs", "rank_mesh", "placements", "as_dtensor",
    "chunk_rows", "to_chunks", "from_chunks", "Saved", "state_dict", "save_state",
    "load_state", "describe_grid", "Checkpoints", "CheckpointParts", "Resumed", "latest",
    "iteration_dir", "reshard_pieces", "clip_grad_norm_", "owns", "AsyncSaver",
    "measure_save_stalls", "state_bytes",
]
