"""Closed-form cost models as small pure functions: notebooks, widgets, planner and tests use them.

- `closed_forms`: bytes on the wire of each collective, α–β time, TP bytes per layer, training
  state per strategy and DP traffic, the pipeline bubble, FLOPs per byte against a link.
- `activations`: a transformer layer's saved activations, region by region, and a meter that
  measures what autograd really saves.
- `memory`: memory per device, by part, for each data-parallel strategy.
- `precision`: what FP8 changes on the wire (TP's and ZeRO-3's bytes, collective by
  collective); `activations` holds its memory side and the loss's fp32 logits. Also the
  training state's bytes per parameter as the ZeRO paper, Megatron-LM, torchtitan and
  DeepSeek-V3 keep it (`state_bytes_per_param`).
- `hardware`: one constant per card (dense bf16 FLOP/s, memory), each with its datasheet.
- `checkpointing`: the checkpoint interval against the failure rate, with the restart cost
  and synchronous or asynchronous saves (Young 1974, Daly 2006).
- `roofline` (import it as `parlab.costs.roofline`): from measured seconds to the GPU check's
  FLOP/s, bytes/s and the FLOPs-per-byte threshold.

Every function of `closed_forms`, `activations`, `memory`, `checkpointing` and `precision`, and
the cards' constants of `hardware`, are importable from here:
`parlab.costs.ring_allreduce_bytes(...)`, `parlab.costs.H100_BF16_FLOPS`.
"""

from parlab.costs.activations import (
    FP8_GEMM_INPUTS,
    PRECISIONS,
    REGIONS,
    SavedTensorMeter,
    activation_breakdown,
    activation_bytes_per_layer,
    logits_bytes,
    region,
    saved_tensor_bytes,
)
from parlab.costs.checkpointing import (
    CHECKPOINT_BYTES_PER_PARAM,
    SAVE_MODES,
    Policy,
    best_interval,
    best_policy,
    checkpoint_bytes,
    checkpoint_overhead,
    daly_interval,
    optimal_overhead,
    policy_overhead,
    young_interval,
)
from parlab.costs.closed_forms import (
    ETHERNET_100G_BYTES_PER_S,
    NIC_400G_BYTES_PER_S,
    NVLINK_BIDIR_BYTES_PER_S,
    NVLINK_PER_DIRECTION_BYTES_PER_S,
    STATE_BYTES_PER_PARAM,
    STRATEGIES,
    all_to_all_bytes,
    alpha_beta_time,
    broadcast_bytes,
    bubble_fraction,
    bubble_ratio,
    comm_verdict,
    dp_flops_per_byte,
    dp_traffic_bytes,
    format_times,
    headroom,
    min_microbatches,
    required_flops_per_byte,
    ring_allgather_bytes,
    ring_allreduce_bytes,
    ring_allreduce_time,
    ring_reduce_scatter_bytes,
    tp_bytes_per_layer,
    tp_flops_per_byte,
    tp_layer_flops_per_byte,
    training_state_bytes,
    transfer_time,
    ulysses_bytes_per_layer,
)
from parlab.costs.hardware import (
    A100_BF16_FLOPS,
    CARDS,
    GB200_BF16_FLOPS,
    GB200_MEMORY_BYTES,
    H100_BF16_FLOPS,
    H100_MEMORY_BYTES,
    H800_BF16_FLOPS,
    HGX_B200_BF16_FLOPS,
    HGX_B200_MEMORY_BYTES,
)
from parlab.costs.memory import GPUS, PARTS, activation_bytes, device_memory, state_breakdown
from parlab.costs.precision import (
    STATE_RECIPES,
    fsdp_bytes_by_collective,
    state_bytes_per_param,
    tp_bytes_by_collective,
)

__all__ = [
    "H100_BF16_FLOPS", "H800_BF16_FLOPS", "A100_BF16_FLOPS", "GB200_BF16_FLOPS",
    "HGX_B200_BF16_FLOPS", "H100_MEMORY_BYTES", "GB200_MEMORY_BYTES", "HGX_B200_MEMORY_BYTES",
    "CARDS", "NVLINK_BIDIR_BYTES_PER_S", "NVLINK_PER_DIRECTION_BYTES_PER_S",
    "NIC_400G_BYTES_PER_S", "ETHERNET_100G_BYTES_PER_S", "STATE_BYTES_PER_PARAM", "STRATEGIES",
    "ring_allreduce_bytes", "ring_allgather_bytes", "ring_reduce_scatter_bytes",
    "all_to_all_bytes", "broadcast_bytes", "transfer_time", "alpha_beta_time",
    "ring_allreduce_time", "tp_bytes_per_layer", "ulysses_bytes_per_layer",
    "training_state_bytes", "dp_traffic_bytes",
    "bubble_fraction", "bubble_ratio", "min_microbatches", "tp_flops_per_byte",
    "tp_layer_flops_per_byte", "dp_flops_per_byte", "required_flops_per_byte", "headroom",
    "format_times", "comm_verdict", "REGIONS", "activation_breakdown",
    "activation_bytes_per_layer", "region", "SavedTensorMeter", "saved_tensor_bytes", "PARTS",
    "GPUS", "state_breakdown", "activation_bytes", "device_memory",
    "CHECKPOINT_BYTES_PER_PARAM", "SAVE_MODES", "Policy", "checkpoint_bytes",
    "checkpoint_overhead", "young_interval", "daly_interval", "optimal_overhead",
    "best_interval", "policy_overhead", "best_policy", "FP8_GEMM_INPUTS", "PRECISIONS",
    "logits_bytes", "tp_bytes_by_collective", "fsdp_bytes_by_collective", "STATE_RECIPES",
    "state_bytes_per_param",
]
