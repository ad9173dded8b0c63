r"""parlab's tables and executor beside `torch.distributed.pipelining`, case by case.

    rows = compare_with_torch(4, [("1f1b", 8, 1), ("interleaved_1f1b", 8, 2),
                                  ("zb_h1", 8, 1), ("dualpipe_v", 10, 2)])
    rows[0].order_difference      # None: torch ran make_schedule's table, action for action
    rows[0].stored_difference     # where the schedule's own pipeline_order differs from it
    rows[0].bit_identical         # torch's gradients equal the executor's, bit for bit

Each case runs twice on the same sizes, each side in one launch for all cases: torch's
schedule (`parlab.pp.torch_run`; a first step untraced, so the bytes are one step's
activations and gradients and not the shapes torch exchanges once) and parlab's executor
(`parlab.pp.run.pipeline_worker`, on gloo: it posts its receives ahead, which NCCL would not
take). torch gets `scale_grads=False` and the loss
divided by m, the executor's arithmetic, unless `scale_grads=True` asks for torch's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from parlab import launch
from parlab.pp.actions import Schedule
from parlab.pp.run import pipeline_worker
from parlab.pp.schedules import make_schedule
from parlab.pp.torch_order import first_difference, torch_name
from parlab.pp.torch_run import TorchRun, run_torch_pipelines

__all__ = ["Comparison", "ExecutorRun", "compare_with_torch"]


@dataclass
class ExecutorRun:
    """parlab's executor on one case: the loss, the gradients, the sends of each rank."""

    loss: float
    grads: dict[str, Tensor]
    sends: list[int]


@dataclass
class Comparison:
    """One schedule on the same p ranks and sizes: parlab's table, torch's run, the executor's."""

    name: str
    p: int
    m: int
    v: int
    table: Schedule  # make_schedule(name, p, m, v)
    torch: TorchRun
    executor: ExecutorRun
    bytes_per_message: int  # one micro-batch's activation (or its gradient)

    @property
    def cls(self) -> str:
        return torch_name(self.name).cls

    @property
    def order_difference(self) -> str | None:
        """Where what torch ran first differs from the table (None: nowhere)."""
        return first_difference([list(r) for r in self.table], [list(r) for r in
                                                                  self.torch.executed],
                                names=("the table", "torch ran"))

    @property
    def stored_difference(self) -> str | None:
        """Where the schedule object's `pipeline_order` first differs from what it ran."""
        return first_difference([list(r) for r in self.torch.executed],
                                [list(r) for r in self.torch.stored],
                                names=("torch ran", "its pipeline_order"))

    @property
    def max_difference(self) -> float:
        """Largest relative difference between torch's gradients and the executor's."""
        return max(float((g - self.executor.grads[n]).abs().max()
                         / self.executor.grads[n].abs().max())
                   for n, g in self.torch.grads.items())

    @property
    def bit_identical(self) -> bool:
        return self.torch.loss == self.executor.loss and all(
            torch.equal(g, self.executor.grads[n]) for n, g in self.torch.grads.items())

    @property
    def executor_bytes(self) -> list[int]:
        """What each rank of the executor sent: its messages, each one activation."""
        return [n * self.bytes_per_message for n in self.executor.sends]


def compare_with_torch(p: int, cases: Sequence[tuple[str, int, int]], *,
                       n_layers: int | None = None, width: int = 16, rows: int = 2,
                       scale_grads: bool = False, timeout: float = 60.0,
                       torch_runs: Sequence[TorchRun] | None = None) -> list[Comparison]:
    """Each case (name, m, v) with torch and with parlab's executor, same model and data:
    n_layers (default 2 per stage) of `width`, m micro-batches of `rows`, float64.
    torch_runs: torch's side already run (`run_torch_pipelines(..., warm=True)` with these
    cases and sizes, in a launch that ran other cases too)."""
    runs = list(torch_runs) if torch_runs is not None else run_torch_pipelines(
        p, cases, n_layers=n_layers, width=width, rows=rows, scale_grads=scale_grads,
        warm=True, timeout=timeout)
    if len(runs) != len(cases) or any(r.name != n for r, (n, _, _) in zip(runs, cases,
                                                                          strict=False)):
        raise ValueError("torch_runs must be one run per case, in the same order")
    jobs, sizes = [], []
    for name, m, v in cases:
        v = 2 if torch_name(name).placement == "v" else v
        layers = 2 * p * v if n_layers is None else n_layers
        sizes.append(v)
        jobs.append((make_schedule(name, p, m, 1 if name == "dualpipe_v" else v),
                     {"n_layers": layers, "width": width, "batch": rows * m}))
    mine = launch.run(_executor_cases, p, jobs, backend="gloo", timeout=timeout)
    out = []
    for k, ((name, m, _), run) in enumerate(zip(cases, runs, strict=True)):
        ranks = [res[k] for res in mine]
        grads = {n: g for res in ranks for n, g in res["grads"].items()}
        loss = next(res["loss"] for res in ranks if res["loss"] is not None)
        executor = ExecutorRun(loss, grads, [res["sends"] for res in ranks])
        out.append(Comparison(name, p, m, sizes[k], jobs[k][0], run, executor,
                              rows * width * 8))
    return out


def _executor_cases(jobs: list[tuple[Schedule, dict]]) -> list[dict]:
    """In a rank: parlab's executor on each schedule, one after the other."""
    return [pipeline_worker(schedule, None, options) for schedule, options in jobs]
