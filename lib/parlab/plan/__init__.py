"""A parallelism planner: every DP × TP × PP (× CP × EP) shape of a cluster, priced and ranked.

- `types`: what the planner is given (`Model`, `Cluster`) and returns (`Plan`).
- `costs`: memory per GPU, bytes per axis and link, stage imbalance; the exposed time of CP
  (ring attention or Ulysses, `CP_KINDS`) and the bubble of each schedule (1F1B or
  DualPipe-V, `SCHEDULES`).
- `presets`: the course's practice problems, published runs and GB200 NVL72 racks.
- `PRECISIONS`: "bf16" or "fp8" (`evaluate(precision=...)`, `parlab.costs.precision`).
- `planner`: `plan`, `best`, `evaluate`, `table`; `timing`: a plan's step, part by part.
- `topology`: `draw_plan`, a plan drawn on the cluster's nodes and links.
- `tables`: module 07's tables as Markdown (`axis_table`, `placement_table`, `plans_table`,
  `published_table`).
"""

from parlab.plan.costs import (
    CP_KINDS,
    DP_GROUP,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    STAGES,
    activation_memory,
    axis_bytes,
    fullest_stage,
    logits_memory,
    nodes_spanned,
    stage_imbalance,
    stage_layers,
    stage_memory,
    stage_params,
    state_memory,
    tp_heads,
)
from parlab.plan.planner import STRATEGIES, best, evaluate, peak_seconds, plan, table
from parlab.plan.presets import (
    DEEPSEEK_CLUSTER,
    DEEPSEEK_V3,
    GB200_NVL72,
    GB200_NVL72_512,
    GB200_RACKS,
    H100_32,
    H100_512,
    HGX_B200_512,
    LLAMA3_405B,
    LLAMA3_405B_LONG,
    LLAMA3_CLUSTER,
    MEGATRON_1T,
    MEGATRON_CLUSTER,
    MODEL_512,
    PRACTICE_70B,
    PRESETS,
    PUBLISHED,
    PUBLISHED_VARIANTS,
    SEED_70B,
)
from parlab.plan.tables import (
    axis_rows,
    axis_table,
    markdown,
    placement_table,
    plans_table,
    published_table,
    variant_plans,
    variants_table,
)
from parlab.plan.topology import AXIS_COLOURS, draw_plan, shown_nodes
from parlab.plan.types import ACHIEVABLE, AxisTraffic, Cluster, Model, Plan, Shape

__all__ = [
    "Model", "Cluster", "Shape", "AxisTraffic", "Plan", "RECOMPUTE", "DP_GROUP", "nodes_spanned",
    "stage_layers", "stage_params", "state_memory", "activation_memory", "axis_bytes",
    "stage_imbalance", "PRACTICE_70B", "SEED_70B", "H100_32", "MODEL_512", "H100_512",
    "LLAMA3_405B", "LLAMA3_CLUSTER", "MEGATRON_1T", "MEGATRON_CLUSTER", "DEEPSEEK_V3",
    "DEEPSEEK_CLUSTER", "PRESETS", "PUBLISHED_VARIANTS", "LLAMA3_405B_LONG", "CP_KINDS",
    "SCHEDULES", "tp_heads", "evaluate", "plan", "best", "table", "STRATEGIES",
    "AXIS_COLOURS", "shown_nodes", "draw_plan", "ACHIEVABLE", "peak_seconds", "PUBLISHED",
    "markdown", "axis_rows", "axis_table", "placement_table", "plans_table", "published_table",
    "variant_plans", "variants_table", "PRECISIONS", "STAGES", "logits_memory", "stage_memory",
    "fullest_stage", "GB200_NVL72", "GB200_NVL72_512", "GB200_RACKS", "HGX_B200_512",
]
