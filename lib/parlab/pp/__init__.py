"""Pipeline parallelism: schedules as data, a simulator, an executor on real ranks, diagrams.

- `schedules`: `Action(kind, microbatch, chunk)`, `make_schedule(name, p, m, v)` for "gpipe",
  "1f1b", "interleaved_1f1b" and "zb_h1", `stage_of` (the looped placement).
- `order`: the dependencies between actions, `validate`, and `run_in_order`.
- `simulator`: `simulate(schedule, t_f, t_b, t_w)` -> makespan, bubble, peak activations;
  `balance_stages` for unequal layers.
- `model`: the toy model (`make_model`, `make_data`), its single-device `reference`, stages.
- `executor`: run one rank's actions over send/recv (`execute`) on a small seeded model.
- `run`: `run_pipeline`, the executor on p ranks compared with one device and the simulator.
- `measure`: the bubble measured from a profiler trace of real runs, beside the simulator and
  the closed form (`measure_bubbles`, `trace_result`, `replay`).
- `plot`: space-time diagrams (`plot_schedule`, `plot_timeline`, `plot_side_by_side`) and the
  bubble over m (`plot_bubbles`).
"""

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
    "interleaved_1f1b", "zb_h1", "stage_of", "rank_and_chunk", "format_schedule", "shape_of",
    "label", "dependencies", "validate", "run_in_order", "Span", "SimResult", "simulate",
    "timeline_stats", "action_cost", "stage_times", "balance_stages", "Layer", "make_model",
    "make_data", "reference", "stage_layers", "build_chunks", "StageContext", "make_context",
    "Mailbox", "execute", "PipelineRun", "run_pipeline", "pipeline_worker", "rank_result",
    "measured_result", "COLOURS", "plot_timeline", "plot_schedule", "plot_side_by_side",
    "range_name", "BubbleSweep", "measure_bubbles", "trace_result", "plot_bubbles",
]
