"""ipywidgets explorers and figures for every module, over `parlab.costs` and the references.

Each explorer is three plain functions plus a constructor (`explorer.Explorer`):
`*_summary(**controls) -> dict`, `describe_*(summary) -> str`, `plot_*(summary) -> Figure`.

- `interconnect` (module 00), `figures` (module 00's pictures of the collectives), `memory`
  (01), `fsdp2` (01: which rank holds which element in the course's layer and in FSDP2, the
  bytes of a step side by side), `tp` (02), `sp` (03), `pp` (04), `cp` (05), `moe` (06),
  `plan` (07), `whole` (08: the 3D rank grid with its links, memory per GPU as recomputation
  and ZeRO change),
  `whole_trace` (08: one traced 3D step, rank by rank),
  `checkpoint` (09: which piece of which tensor a distributed checkpoint holds in which file),
  `checkpoint_policy` (09: the save interval against the failure rate, sync or async saves,
  and a measured save's stall).
"""

from parlab.widgets.checkpoint import (
    Piece,
    checkpoint_pieces,
    describe_checkpoint,
    plot_checkpoint,
)
from parlab.widgets.checkpoint_policy import (
    describe_policy,
    plot_policy,
    plot_save_stalls,
    policy_explorer,
    policy_summary,
)
from parlab.widgets.cp import (
    describe_work,
    plot_measured_work,
    plot_ring_schedule,
    plot_ring_vs_ulysses,
    plot_work,
    work_explorer,
    work_summary,
)
from parlab.widgets.explorer import Explorer, Summary, log_slider
from parlab.widgets.figures import (
    collective_states,
    draw_collective,
    draw_ring_allreduce,
    plot_allreduce_time,
    ring_allreduce_states,
)
from parlab.widgets.fsdp2 import plot_shard_owners, plot_step_bytes
from parlab.widgets.interconnect import (
    CUSTOM,
    LINK_PRESETS_GBPS,
    describe_interconnect,
    interconnect_explorer,
    interconnect_summary,
    plot_interconnect,
)
from parlab.widgets.memory import describe_memory, memory_explorer, memory_summary, plot_memory
from parlab.widgets.moe import (
    a2a_explorer,
    a2a_summary,
    capacity_explorer,
    capacity_summary,
    describe_a2a,
    describe_capacity,
    plot_a2a,
    plot_capacity,
    skewed_routing,
)
from parlab.widgets.plan import (
    Planner,
    describe_planner,
    planner_summary,
    planner_widget,
    plot_planner,
)
from parlab.widgets.pp import describe_pipeline, pipeline_explorer, pipeline_summary, plot_pipeline
from parlab.widgets.sp import (
    activation_explorer,
    activation_summary,
    describe_activations,
    plot_activations,
    plot_sp_layout,
)
from parlab.widgets.tp import (
    describe_tp_comm,
    layer_flops,
    plot_mlp_sharding,
    plot_tp_comm,
    tp_comm_explorer,
    tp_comm_summary,
)
from parlab.widgets.whole import (
    describe_grid,
    describe_memory_3d,
    grid_explorer,
    grid_summary,
    h100_cluster,
    memory_explorer_3d,
    memory_summary_3d,
    plot_grid,
    plot_memory_3d,
)
from parlab.widgets.whole_trace import classify, last_step, plot_step_trace

__all__ = [
    "Explorer", "Summary", "log_slider", "interconnect_explorer", "interconnect_summary",
    "describe_interconnect", "plot_interconnect", "LINK_PRESETS_GBPS", "CUSTOM", "draw_collective",
    "draw_ring_allreduce", "plot_allreduce_time", "collective_states", "ring_allreduce_states",
    "memory_explorer", "memory_summary", "describe_memory", "plot_memory", "tp_comm_explorer",
    "tp_comm_summary", "describe_tp_comm", "plot_tp_comm", "plot_mlp_sharding", "layer_flops",
    "activation_explorer", "activation_summary", "describe_activations", "plot_activations",
    "plot_sp_layout", "pipeline_explorer", "pipeline_summary", "describe_pipeline",
    "plot_pipeline", "work_summary", "describe_work", "plot_work", "work_explorer",
    "plot_ring_vs_ulysses",
    "plot_ring_schedule", "plot_measured_work", "capacity_explorer", "capacity_summary",
    "describe_capacity", "plot_capacity", "a2a_explorer", "a2a_summary", "describe_a2a",
    "plot_a2a", "skewed_routing", "planner_widget", "planner_summary", "describe_planner",
    "plot_planner", "Planner", "grid_summary", "describe_grid", "plot_grid", "grid_explorer",
    "memory_summary_3d", "describe_memory_3d", "plot_memory_3d", "memory_explorer_3d",
    "h100_cluster", "classify", "last_step", "plot_step_trace",
    "Piece", "checkpoint_pieces", "describe_checkpoint", "plot_checkpoint",
    "policy_summary", "describe_policy", "plot_policy", "policy_explorer", "plot_save_stalls",
    "plot_shard_owners", "plot_step_bytes",
]
