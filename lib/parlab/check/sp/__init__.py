r"""Graded checks of module 03, "Sequence parallelism": one module per exercise.

| check               | exercise | module    | builds on |
|---------------------|----------|-----------|-----------|
| `check_sp_pair`     | 1        | `pair`    |           |
| `check_sp_dropout`  | 2        | `dropout` |           |
| `check_sp_block`    | 3        | `block`   | 1, 2      |
| `check_sp_bytes`    | 4        | `bytes`   | 1, 2, 3   |
| `check_saved_bytes` | 5        | `memory`  |           |
| `check_torch_sp`    | 6        | `torch_sp` |          |

The distributed checks run the learner's code on `world_size` ranks
(`parlab.check.run_checked`) and compare each rank's rows with the single-device result from
the same weights, every parameter randomised (LayerNorms included); shards must own their
memory and inputs must be left unchanged. Sizes (`common`): B = 2 sequences of T = 12 tokens,
hidden 48, 12 heads, so t = 2, 3 and 4 are all valid. A later check that fails while an exercise
it builds on failed says so first (`parlab.check.exercise`). The in-rank helpers and the
comparisons are module 02's (`parlab.check.tp.common`, `.compare`); the byte formula is checked
as in module 02 (`parlab.check.tp.formula`), with the course's cost functions refused.

Exercise 6 builds the TP + SP layer with PyTorch's API (`SequenceParallel`,
`PrepareModuleInput`): `torch_sp` (its rank half `torch_sp_worker`, its hints `torch_sp_hints`)
compares it with one device and its collectives with the SPBlock's, part by part, on module
02's helpers for PyTorch's API (`parlab.check.tp.torch_common`).

In the ranks, parlab's own sequence-parallel code raises CheckFailed when used, and so does
parlab.costs.activations while `saved_bytes` runs: an answer that re-exports, wraps or
subclasses them is rejected.
"""

from parlab.check.sp.block import check_sp_block
from parlab.check.sp.bytes import check_sp_bytes
from parlab.check.sp.dropout import check_sp_dropout
from parlab.check.sp.memory import check_saved_bytes
from parlab.check.sp.pair import check_sp_pair
from parlab.check.sp.torch_sp import check_torch_sp
from parlab.errors import CheckFailed

__all__ = ["check_sp_pair", "check_sp_dropout", "check_sp_block", "check_sp_bytes",
           "check_saved_bytes", "check_torch_sp", "CheckFailed"]
