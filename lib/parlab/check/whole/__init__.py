r"""Graded checks of module 08, "The whole machine": one module per exercise.

| check                  | exercise | module      | builds on |
|------------------------|----------|-------------|-----------|
| `check_overlapped_ddp` | 1        | `ddp`       |           |
| `check_recompute`      | 2        | `recompute` |           |
| `check_train_3d`       | 3        | `step`      | 1         |
| `check_plan_70b`       | 4        | `plan`      |           |
| `check_clip_grad_norm` | 5        | `clip`      |           |

Exercise 1 runs the learner's `OverlappedDDP` on 2 and 3 ranks and on 4 in two groups of 2
(`bucket_bytes` 1248, two layers exactly, and 600) against the single-device gradients and
parlab.comm's view of its calls (nothing inside no_sync, buckets started during backward,
asynchronously, over the group, in the order 0, 1, 2, ... on every rank although each rank's
branches become ready in another order; a frozen layer left out). Exercise 2 runs
`recompute_forward` in the kernel: outputs and gradients against the layer without
recomputation, in training and in eval mode, at two sizes, head counts and dropout
probabilities, saved bytes measured against Korthikanti et al.'s closed form, recomputed
FLOPs counted; and `saved_bytes_formula` at many sizes. Exercise 3 runs `train_3d` on 8
ranks (DP 2 × PP 2 × TP 2 + SP; DP 3 × PP 2 in the hidden test, SGD in both) against the
single-device losses at every step, with the replicas' weights compared to name a missing
reduction and the rows each replica's stages ran compared with the batch. Exercise 4
compares `memory_per_gpu` (the first and the last pipeline stage, the loss's fp32 logits on
the last) and `bytes_per_step` with the planner of module 07 and judges the learner's plan
for a 70B model on 256 H100 with it, on its fullest GPU. Exercise 5 runs `clip_grad_norm_` on
the composed Llama's final gradients (four 4-rank grids: PP 2 × TP 2, DP 2 × TP 2 + SP, MoE
EP 2 × TP 2 + SP, CP 2 × PP 2; 8 and 4 ranks in the hidden test) against
`torch.nn.utils.clip_grad_norm_` on one device, the norm and the clipped gradients.

Each check's module docstring lists what a right answer must not depend on and which test
varies it.

A later check that fails while the exercise it builds on failed says so first
(`parlab.check.exercise`). The references each exercise must not call are listed in
`common`; they raise CheckFailed while the learner's code runs (aliases, wrappers and
subclasses alike).
"""

from parlab.check.whole.clip import check_clip_grad_norm
from parlab.check.whole.ddp import check_overlapped_ddp
from parlab.check.whole.plan import check_plan_70b
from parlab.check.whole.recompute import check_recompute
from parlab.check.whole.step import check_train_3d
from parlab.errors import CheckFailed

__all__ = ["check_overlapped_ddp", "check_recompute", "check_train_3d", "check_plan_70b",
           "check_clip_grad_norm", "CheckFailed"]
