"""The course's composed model and the torch-API one on the same grid, side by side.

    rows = run(compare_builds, 4, LlamaConfig(), Plan(dp=2, pp=2, micro_batch_size=2), lr=3e-3)
    print(side_by_side(rows, plan))          # a Markdown table: bytes, state, time per step

On every rank, for each build (`parlab.compose.setup` / `train_step` and
`parlab.compose.titan.setup_titan` / `titan_step`): step 0 untimed (first calls pay for
lazy set-up), then `steps` steps, each timed; the bytes this rank sent in step 1
(`traffic.step_traffic`: the course's tracer for torch.distributed's calls, a dispatch mode
for DTensor's functional collectives) and the weights, gradients and Adam moments it holds
after it (`traffic.state_bytes`). The two builds run one after the other in the same ranks,
so a busy machine slows both alike only roughly: the benchmark (benchmarks/bench_titan.py)
alternates them for its timings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from parlab.compose.titan.traffic import state_bytes, step_traffic
from parlab.compose.titan.train import setup_titan, titan_step
from parlab.compose.train import Plan, setup, train_step
from parlab.model.corpus import load_corpus
from parlab.model.llama import LlamaConfig

__all__ = ["BUILDS", "build", "measure", "compare_builds", "side_by_side"]

BUILDS = ("composed", "torch API")


def build(name: str, cfg: LlamaConfig, plan: Plan, *, lr: float) -> tuple[Callable, Any]:
    """(step(i) -> loss, (params, optimizer)) of build `name` on this rank (collective)."""
    tokens, _ = load_corpus()
    if name == "composed":
        rep = setup(cfg, plan, lr=lr)
        return (lambda i: train_step(rep, i, tokens)), (rep.model.unique_parameters(),
                                                         rep.optimizer)
    if name == "torch API":
        trep = setup_titan(cfg, plan, lr=lr)
        return (lambda i: titan_step(trep, i, tokens)), (list(trep.part.parameters()),
                                                          trep.optimizer)
    raise ValueError(f"no build {name!r}: one of {BUILDS}")


def measure(step: Callable[[int], float], held: Any, steps: int) -> dict[str, Any]:
    """Step 0, step 1 under the byte counters, then steps 2.. timed; what it cost."""
    losses = [step(0)]
    traffic = step_traffic(lambda: losses.append(step(1)))
    seconds = []
    for i in range(2, steps):
        start = time.perf_counter()
        losses.append(step(i))
        seconds.append(time.perf_counter() - start)
    params, optimizer = held
    return {"losses": losses, "bytes": traffic.total, "funcol bytes": traffic.funcol,
            "calls": traffic.calls, "state": state_bytes(params, optimizer),
            "seconds": statistics.median(seconds) if seconds else float("nan")}


def compare_builds(cfg: LlamaConfig, plan: Plan, *, lr: float, steps: int = 4
                   ) -> dict[str, dict[str, Any]]:
    """Both builds on this rank (every rank calls it): `measure` of each."""
    if steps < 2:
        raise ValueError(f"steps={steps}: step 1 is the one whose bytes are counted")
    return {name: measure(*build(name, cfg, plan, lr=lr), steps) for name in BUILDS}


def side_by_side(rows: list[dict[str, dict[str, Any]]], plan: Plan) -> str:
    """A Markdown table of `compare_builds`'s results on all ranks: the largest rank's
    bytes sent in a step and state held, and the slowest rank's median seconds."""
    grid = f"dp={plan.dp} pp={plan.pp} tp={plan.tp}" + (" SP" if plan.sequence_parallel else "")
    lines = ["| grid | build | bytes sent per step (max rank) | of which DTensor's | "
             "weights + grads + Adam bytes (max rank) | ms per step | last loss |",
             "|---|---|---|---|---|---|---|"]
    for name in BUILDS:
        mine = [r[name] for r in rows]
        held = max(sum(m["state"].values()) for m in mine)
        lines.append(f"| {grid} | {name} | {max(m['bytes'] for m in mine):,.0f} | "
                     f"{max(m['funcol bytes'] for m in mine):,.0f} | {held:,} | "
                     f"{1e3 * max(m['seconds'] for m in mine):.1f} | "
                     f"{mine[0]['losses'][-1]:.6f} |")
    return "\n".join(lines)
