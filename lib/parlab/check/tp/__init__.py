r"""Graded checks of module 02, "Tensor parallelism": one module per exercise.

| check                    | exercise | module      | builds on            |
|--------------------------|----------|-------------|----------------------|
| `check_f_g`              | 1        | `fg`        |                      |
| `check_parallel_linears` | 2        | `linears`   | 1                    |
| `check_tp_mlp`           | 3        | `mlp`       | 1, 2                 |
| `check_row_first`        | 4        | `mlp`       | 1, 2                 |
| `check_tp_attention`     | 5        | `attention` | 1, 2                 |
| `check_tp_block`         | 6        | `block`     | 1, 2, 3, 5           |
| `check_vocab_embedding`  | 7        | `vocab`     | 1                    |
| `check_vocab_cross_entropy` | 8     | `vocab`     |                      |
| `check_torch_tp`         | 9        | `torch_tp`  |                      |

Every check runs the learner's code on `world_size` ranks (`parlab.check.run_checked`) and
compares it, rank by rank, with the single-device module built from the same weights, every
parameter randomised (parlab.model.MLP, Attention and Block): outputs, the input gradient and
the gradient of every parameter shard; shards must own their memory and inputs must be left
unchanged. The tracer (`parlab.comm.trace`) counts the collectives of the forward and of the
backward pass separately. A later check that fails while an exercise it builds on failed says
so first (`parlab.check.exercise`; the keys and prerequisites: `keys`). Shared sizes and the
helpers run in the ranks: `common`; the likely-mistake sentences: `hints`; comparisons made in
the parent: `compare`; the byte formula: `formula`. The vocabulary exercises (7, 8) compare
with F.embedding and F.cross_entropy computed in the kernel, and measure that the loss never
moves the logits (`vocab`; its likely mistakes: `vocab_hints`).

Inputs and tolerances:
- f and g (exercise 1): rank r's input is filled with r and its upstream gradient with r + 1,
  in float64, so every expected value is a small whole number and the comparison is exact.
- the parallel linears (exercise 2) run in float64: rtol=1e-10, atol=1e-12.
- the MLP, attention and the layer (exercises 3-6) run in float32 like training, with hidden
  size 48 and 12 heads, so that t = 2, 3 and 4 are all valid: rtol=1e-5, atol=1e-4 (the
  randomised layers' values are of order 10, and a different summation order moves an entry
  by up to ~1e-5; a wrong shard or a missing all-reduce moves it by ~1e-1).

Exercise 9 builds the same tensor parallelism with PyTorch's API (`parallelize_module`,
`loss_parallel`): `torch_tp` compares it with one device and its collectives, part by part,
with this module's TP; its rank half is `torch_tp_worker`, what it shares with module 03's
exercise 6 `torch_common`, the API's pitfalls by the words of its errors `torch_hints`.

In the ranks, parlab's own TP classes (parlab.tp) raise CheckFailed when used, and while a byte
formula runs so do the course's cost functions: an answer that re-exports, wraps or subclasses
them is rejected.
"""

from parlab.check.tp.attention import check_tp_attention
from parlab.check.tp.block import check_tp_block
from parlab.check.tp.fg import check_f_g
from parlab.check.tp.linears import check_parallel_linears
from parlab.check.tp.mlp import check_row_first, check_tp_mlp
from parlab.check.tp.torch_tp import check_torch_tp
from parlab.check.tp.vocab import check_vocab_cross_entropy, check_vocab_embedding
from parlab.errors import CheckFailed

__all__ = ["check_f_g", "check_parallel_linears", "check_tp_mlp", "check_row_first",
           "check_tp_attention", "check_tp_block", "check_vocab_embedding",
           "check_vocab_cross_entropy", "check_torch_tp", "CheckFailed"]
