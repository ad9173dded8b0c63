r"""Graded checks of module 05, "Context parallelism"; test cells import them from here.

- `check_merge(merge)` (exercise 1, `merge`): the online-softmax merge of two partials.
- `check_ring_forward(ring_attention)` (exercise 2, `forward`): ring attention on real
  ranks; it uses the learner's merge, and says so when exercise 1 failed first.
- `check_ring_backward(ring_attention_backward)` (exercise 3, `backward`).
- `check_layouts(layout_positions)` (exercise 4, `layouts`): striped and zigzag.
- `check_ulysses(seq_to_heads, heads_to_seq)` (exercise 5, `ulysses`): Ulysses' two
  all-to-all reshuffles, then attention built from them, forward and backward.
- `check_allgather(allgather_attention)` (exercise 6, `allgather`): Llama 3's all-gather
  attention under a document-and-causal mask in the zigzag layout, outputs and gradients.
- `check_context_parallel(cp_attention, ring_attention)` (exercise 7, `torch_cp`, ranks'
  half in `torch_cp_ranks`): PyTorch's `context_parallel` around non-causal SDPA on a 1-D or
  (dp, cp) mesh, outputs and gradients against one device, load balancing off, an uneven
  sequence refused; the learner's ring beside it.

`common` holds the sizes (6 tokens per rank: 12, 18, 24 tokens on 2, 3, 4 ranks), the
float64 references and the likely-mistake sentences; `ranks` what the ring checks do in the
ranks: a recorder of every communication call and matrix product (the overlap is measured
from outside the learner's code and parlab's), the checks made before a tensor is exchanged,
and the inputs compared after the call.
"""

from parlab.check.cp.allgather import check_allgather
from parlab.check.cp.backward import check_ring_backward
from parlab.check.cp.forward import check_ring_forward
from parlab.check.cp.layouts import check_layouts
from parlab.check.cp.merge import check_merge
from parlab.check.cp.torch_cp import check_context_parallel
from parlab.check.cp.ulysses import check_ulysses
from parlab.errors import CheckFailed

__all__ = ["check_merge", "check_ring_forward", "check_ring_backward", "check_layouts",
           "check_ulysses", "check_allgather", "check_context_parallel", "CheckFailed"]
