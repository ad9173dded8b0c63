r"""Graded checks of module 04, "Pipeline parallelism"; test cells import them from here.

- `check_1f1b(one_f_one_b)` (exercise 1, `schedule`): the 1F1B order as data.
- `check_p2p_step(forward_step, backward_step, one_f_one_b)` (exercise 2, `p2p`): the
  learner's point-to-point steps under GPipe and under their own 1F1B order on real ranks.
- `check_placement(stage_of, layers_of)` (exercise 3, `placement`): looped placement, then
  interleaved 1F1B on real ranks with the learner's split.
- `check_balance(balance)` (exercise 5, `balance`): layers per stage for unequal layers.
- `check_dualpipe_v(v_stage_of, dualpipe_v_order)` (exercise 4, `dualpipe_v`): the V
  placement, one rank's DualPipe-V order, then the learner's orders on real ranks.
- `check_torch_pipeline(torch_pipeline_step, one_f_one_b, forward_step, backward_step,
  dualpipe_v_order)` (exercise 6, `torch_pipeline`): the same schedules with
  torch.distributed.pipelining on the learner's split, against one device, the learner's
  tables and the learner's executor (`torch_api`; what it watches in the ranks: `torch_guard`).

`common` holds what the rank checks share: sizes no answer can special-case (m = 2p + 1,
3 layers per stage), the single-device reference and the guard that checks every
point-to-point tensor before it is exchanged. While a learner's function runs, parlab's own
answers (parlab.pp's one_f_one_b, stage_of, balance_stages, DualPipe-V) raise CheckFailed.
"""

from parlab.check.pp.balance import BALANCE_CASES, check_balance
from parlab.check.pp.dualpipe import ORDER_CASES, check_dualpipe_v
from parlab.check.pp.p2p import check_p2p_step
from parlab.check.pp.placement import check_placement
from parlab.check.pp.schedule import SCHEDULE_CASES, check_1f1b
from parlab.check.pp.torch_api import check_torch_pipeline, torch_cases
from parlab.errors import CheckFailed

__all__ = ["check_1f1b", "check_p2p_step", "check_placement", "check_balance",
           "check_dualpipe_v", "check_torch_pipeline", "torch_cases", "CheckFailed",
           "BALANCE_CASES", "SCHEDULE_CASES", "ORDER_CASES"]
