"""Pipeline parallelism: schedules as data, a simulator, an executor on real ranks, diagrams.

- `actions`: `Action(kind, microbatch, chunk)`, `Schedule`, where stages sit:
  `stage_of(rank, chunk, p, *, placement="looped")` (c p + r) or `placement="v"` (DualPipe-V:
  chunk 0 is stage r, chunk 1 stage 2p - 1 - r), its inverse `rank_and_chunk`, and
  `PlacedSchedule`, a schedule that carries its `placement` and its overlapped F&B units
  (read them from any schedule with `placement_of` and `overlapped_units`).
- `schedules`: `make_schedule(name, p, m, v)` for "gpipe", "1f1b", "interleaved_1f1b",
  "zb_h1" (looped) and "dualpipe_v" (V placement, a `PlacedSchedule`).
- `dualpipe`: DualPipe-V's eight phases, its published bubble and peak memory.
- `order`: the dependencies between actions, `validate(schedule, placement=None)`, and
  `run_in_order`; both follow the schedule's placement unless `placement=` says otherwise.
- `simulator`: `simulate(schedule, t_f, t_b, t_w, *, t_fb=None)` -> makespan, bubble, peak
  activations (t_fb: what an overlapped F&B unit costs; None runs its actions one after the
  other); `balance_stages` for unequal layers.
- `model`: the toy model (`make_model`, `make_data`), its single-device `reference`, stages.
- `executor`: run one rank's actions over send/recv (`execute`) on a small seeded model,
  in either placement; overlapped units run one action after the other.
- `run`: `run_pipeline`, the executor on p ranks compared with one device and the simulator.
- `measure`: the bubble measured from a profiler trace of real runs, beside the simulator and
  the closed form (`measure_bubbles`, `trace_result`, `replay`).
- `plot`: space-time diagrams (`plot_schedule`, `plot_timeline`, `plot_side_by_side`) and the
  bubble over m (`plot_bubbles`).

The same pipelines with PyTorch's API, `torch.distributed.pipelining` (imported from these
modules, not from here: it costs a second to import):
- `torch_order`: what a torch schedule ran, recorded from its stages' calls, and the table it
  stores, both as parlab Actions (`recording`, `executed_actions`, `stored_actions`).
- `torch_run`: PipelineStages and a schedule object on the toy model's split, one step, on p
  ranks (`run_torch_pipeline`, `run_torch_pipelines`).
- `torch_compare`: the course's tables and executor beside torch's run (`compare_with_torch`).
- `plot_compare`: two orders side by side (`plot_orders`, `plot_lists`).
"""

from parlab.pp.actions import (
    PLACEMENTS,
    PlacedSchedule,
    overlapped_units,
    placement_of,
)
from parlab.pp.dualpipe import (
    dualpipe_v_bubble,
    dualpipe_v_makespan,
    dualpipe_v_peak,
    dualpipe_v_phases,
    dualpipe_v_rank,
)
from parlab.pp.executor import Mailbox, StageContext, execute, make_context, range_name
from parlab.pp.measure import BubbleSweep, measure_bubbles, trace_result
from parlab.pp.model import Layer, build_chunks, make_data, make_model, reference, stage_layers
from parlab.pp.order import dependencies, run_in_order, validate
from parlab.pp.plot import COLOURS, plot_bubbles, plot_schedule, plot_side_by_side, plot_timeline
from parlab.pp.run import PipelineRun, measured_result, pipeline_worker, rank_result, run_pipeline
from parlab.pp.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    dualpipe_v,
    format_schedule,
    gpipe,
    interleaved_1f1b,
    label,
    make_schedule,
    one_f_one_b,
    rank_and_chunk,
    shape_of,
    stage_of,
    zb_h1,
)
from parlab.pp.simulator import (
    SimResult,
    Span,
    action_cost,
    balance_stages,
    simulate,
    stage_times,
    timeline_stats,
)

__all__ = [
    "Action", "Schedule", "ScheduleError", "SCHEDULES", "make_schedule", "gpipe", "one_f_one_b",
    "interleaved_1f1b", "zb_h1", "dualpipe_v", "stage_of", "rank_and_chunk", "PLACEMENTS",
    "PlacedSchedule", "placement_of", "overlapped_units", "dualpipe_v_rank",
    "dualpipe_v_phases", "dualpipe_v_bubble", "dualpipe_v_makespan", "dualpipe_v_peak",
    "format_schedule", "shape_of",
    "label", "dependencies", "validate", "run_in_order", "Span", "SimResult", "simulate",
    "timeline_stats", "action_cost", "stage_times", "balance_stages", "Layer", "make_model",
    "make_data", "reference", "stage_layers", "build_chunks", "StageContext", "make_context",
    "Mailbox", "execute", "PipelineRun", "run_pipeline", "pipeline_worker", "rank_result",
    "measured_result", "COLOURS", "plot_timeline", "plot_schedule", "plot_side_by_side",
    "range_name", "BubbleSweep", "measure_bubbles", "trace_result", "plot_bubbles",
]
