"""Context parallelism: blockwise attention with the online softmax, and ring attention.

- `blocks`: one block of attention with its log-sum-exp, the merge of partial results, the
  full-attention reference and the block backward.
- `fused`: the same block through PyTorch's fused flash-attention kernel, forward and
  backward, cut into full, causal-diagonal and skipped pieces: the reference ring's kernel.
- `ring`: ring attention over isend/irecv, forward and backward (`ring_attention`).
- `layout`: which tokens each rank holds (contiguous, striped, zigzag), its causal work, and
  when the ring hides its transfers.
- `measure`: measured overlap and per-rank work on real ranks.
- `trace`: the ring in a profiler trace, its transfers per step and the share hidden behind
  compute (`trace_ring`, `plot_ring_trace`).
- `ulysses`: Ulysses (DeepSpeed-Ulysses): an all-to-all from sequence shards to head shards,
  attention over the whole sequence, an all-to-all back (`seq_to_heads`, `heads_to_seq`,
  `ulysses_attention`); `check_heads` enforces the cap at the head count.
- `allgather`: Llama 3's all-gather context parallelism: K and V all-gathered in position
  order (`gather_from_context_parallel_region`, backward a reduce-scatter), each rank's queries
  against every key under a document-and-causal mask (`allgather_attention`, `document_ids`,
  `document_mask`).
- `compare`: ring against Ulysses, bytes and exposed time per layer (`attention_comm`); the
  all-gather's bytes (`allgather_bytes_per_layer`) and each scheme's K/V memory
  (`kv_bytes_held`).
- `torch_cp`: PyTorch's own `context_parallel` (what it runs on GPUs and on a CPU, torch
  2.13): the course's use of it (`context_parallel_attention`), its load-balanced layout
  (`head_tail_table`), the SDPA backends to run it under (`cp_sdpa`), and a trace of DTensor's
  functional collectives, which parlab.comm does not see (`functional_trace`);
  `torch_compare`: it beside a ring and one device, bytes and memory (module 05, section 10).
"""

from parlab.cp.allgather import (
    allgather_attention,
    document_ids,
    document_mask,
    gather_from_context_parallel_region,
)
from parlab.cp.blocks import (
    accum_dtype,
    block_attention,
    block_attention_backward,
    empty_partial,
    full_attention,
    merge_partials,
)
from parlab.cp.compare import (
    CP_KINDS,
    allgather_bytes_per_layer,
    attention_comm,
    kv_bytes_held,
    ring_bytes_per_layer,
)
from parlab.cp.fused import fused_attention, fused_attention_backward
from parlab.cp.layout import (
    LAYOUTS,
    block_backward_flops,
    block_bytes,
    block_flops,
    causal_work,
    layout_positions,
    min_hiding_block,
    position_table,
    ring_pace,
    step_work,
)
from parlab.cp.measure import measure_overlap, measure_work, plot_timelines
from parlab.cp.ring import (
    RingAttention,
    Transfer,
    fully_masked,
    ring_attention,
    ring_attention_backward,
    ring_attention_forward,
    shift_right,
)
from parlab.cp.trace import RingTrace, plot_ring_trace, trace_ring
from parlab.cp.ulysses import (
    UlyssesAttention,
    check_heads,
    heads_to_seq,
    seq_to_heads,
    ulysses_attention,
    ulysses_attention_forward,
)

__all__ = [
    "block_attention", "block_attention_backward", "merge_partials", "full_attention",
    "empty_partial", "accum_dtype", "fused_attention", "fused_attention_backward",
    "Transfer", "shift_right",
    "ring_attention_forward", "ring_attention_backward", "RingAttention", "ring_attention",
    "fully_masked", "LAYOUTS", "layout_positions", "position_table", "causal_work", "step_work",
    "ring_pace", "block_flops", "block_backward_flops", "block_bytes", "min_hiding_block",
    "measure_overlap",
    "measure_work", "plot_timelines", "check_heads", "seq_to_heads", "heads_to_seq",
    "UlyssesAttention", "ulysses_attention", "ulysses_attention_forward", "CP_KINDS",
    "attention_comm", "ring_bytes_per_layer", "RingTrace", "trace_ring",
    "plot_ring_trace", "document_ids", "document_mask", "gather_from_context_parallel_region",
    "allgather_attention", "allgather_bytes_per_layer", "kv_bytes_held",
]
