"""What notebook test cells call: compare a learner's result with a reference, and say why not.

A failed check raises `CheckFailed` (an AssertionError, so nbgrader scores the cell 0) with a
message a learner can act on: which rank, which tensor, expected against got, and the likely
mistake. In a notebook it shows only that message and the learner's own frames
(`parlab.errors.Readable`).

The public names are the ones a test cell or a learner's own check needs: `CheckFailed`, `fail`,
`assert_close`, `assert_equal`, `expect_type`, `call_learner` (the one call wrapper), `ranks` (a
worker on ranks, for an instructor's own test), `run_checked` (the one rank runner, which turns
a hang or a rank's CheckFailed into the test's CheckFailed), `exercise` (a later check says when
an earlier exercise it builds on failed) and `reset_outcomes`. Checks stop learner ranks at
`_harness.CHECK_TIMEOUT_S`, well below nbgrader's cell timeout, so a deadlocked answer fails its
own test and the rest still grade.

- `_compare`: the comparisons, and the guards against answers that only look right:
  `assert_owns_only` (a shard that keeps the whole tensor alive), `assert_unchanged` (an input
  modified in place), `randomize_parameters` (defaults that hide a mistake).
- `_harness`: how learner code is run, and how the course's own reference is refused
  (`refuse_in_rank`, `not_reexport`, `not_reference`).
- One package or module per course module: `collectives` (00), `fsdp` (01), `tp` (02),
  `sp` (03), `pp` (04), `cp` (05), `moe` (06), `composition` and `capstone` (07), `whole`
  (08), `checkpoint` and `checkpoint_policy` (09).

Tolerances: float32 results that only differ in summation order agree to about 1e-6
relative; we allow `rtol=1e-5, atol=1e-6` unless a check states otherwise.
"""

from parlab.check._compare import assert_close, assert_equal, expect_type, fail
from parlab.check._harness import call_learner, exercise, ranks, reset_outcomes, run_checked
from parlab.errors import CheckFailed

__all__ = ["CheckFailed", "fail", "assert_close", "assert_equal", "expect_type", "call_learner",
           "ranks", "run_checked", "exercise", "reset_outcomes"]
