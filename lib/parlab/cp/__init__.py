"""Context parallelism: blockwise attention with the online softmax, and ring attention.

- `blocks`: one block of attention with its log-sum-exp, the merge of partial results, the
  full-attention reference and the block backward.
- `fused`: the same block through PyTorch's fused flash-attention kernel, forward and
  backward, cut into full, causal-diagonal and skipped pieces: the reference ring's kernel.
- `ring`: ring attention over isend/irecv, forward and backward (`ring_attention`).
- `layout`: which tokens each rank holds (contiguous, striped, zigzag), its causal work, and
  when the ring hides its transfers.
- `measure`: measured overlap and per-rank work on real ranks.
"""

from parlab.cp.blocks import (
    accum_dtype,
    block_attention,
    block_attention_backward,
    empty_partial,
    full_attention,
    merge_partials,
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

__all__ = [
    "block_attention", "block_attention_backward", "merge_partials", "full_attention",
    "empty_partial", "accum_dtype", "fused_attention", "fused_attention_backward",
    "Transfer", "shift_right",
    "ring_attention_forward", "ring_attention_backward", "RingAttention", "ring_attention",
    "fully_masked", "LAYOUTS", "layout_positions", "position_table", "causal_work", "step_work",
    "ring_pace", "block_flops", "block_backward_flops", "block_bytes", "min_hiding_block",
    "measure_overlap",
    "measure_work", "plot_timelines",
]
