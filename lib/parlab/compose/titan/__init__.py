"""Module 08's Llama built the torchtitan way, beside the course's composition
(`parlab.compose`), and its checkpoints in module 09's format.

- `model`: `TitanLlama` (torchtitan's layout: tok_embeddings, layers "0".., norm, output; the
  single-device Llama's weights), `TitanBlock`, `split_stage` (a pipeline stage, in place),
  `stage_layers`.
- `names`: `single_name`, `titan_names` (torchtitan's parameter names <-> the course's).
- `parallelize`: `world_mesh` (the DeviceMesh dp × pp × tp), `block_plan`, `top_plan`,
  `apply_tp`, `apply_fsdp`, `parallelize_llama` (torchtitan's, TP + SP and FSDP2).
- `train`: `TitanReplica`, `setup_titan`, `titan_step`, `train_titan`, `sync_tied`,
  `check_titan_plan`, `build_schedule`, `full_grads` (step's gradients whole, by the
  single device's names).
- `traffic`: `step_traffic` (the bytes a rank sends in a step: parlab.comm's tracer for
  torch.distributed's calls, `parlab.comm.dispatch.functional_trace` for DTensor's
  functional collectives),
  `state_bytes` (weights, gradients, Adam's moments per rank).
- `compare`: `build`, `compare_builds`, `side_by_side` (the composed model and this one on
  one grid: bytes, state, time per step; benchmarks/bench_titan.py alternates them).
- `checkpoint` (module 09): `save_titan`, `load_titan`, `titan_state`: PyTorch's
  `get_model_state_dict` / `get_optimizer_state_dict` through DCP, under the course's names,
  so that either build loads the other's checkpoint on any grid.
"""

from parlab.compose.titan.model import TitanBlock, TitanLlama, split_stage, stage_layers
from parlab.compose.titan.names import single_name, titan_names
from parlab.compose.titan.parallelize import (
    MESH_DIMS,
    apply_fsdp,
    apply_tp,
    block_plan,
    parallelize_llama,
    top_plan,
    world_mesh,
)
from parlab.compose.titan.train import (
    TitanReplica,
    build_schedule,
    check_titan_plan,
    full_grads,
    setup_titan,
    sync_tied,
    titan_step,
    train_titan,
)

__all__ = [
    "TitanLlama", "TitanBlock", "split_stage", "stage_layers", "single_name", "titan_names",
    "MESH_DIMS", "world_mesh", "block_plan", "top_plan", "apply_tp", "apply_fsdp",
    "parallelize_llama", "TitanReplica", "check_titan_plan", "build_schedule", "setup_titan",
    "sync_tied", "titan_step", "train_titan", "full_grads",
]
