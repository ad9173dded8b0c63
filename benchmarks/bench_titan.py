"""Module 08's Llama, a training step: the course's composed model against the torch-API one.

    make bench        or        .venv/bin/python benchmarks/bench_titan.py [--repeats 10]

On 4 gloo ranks (parlab.launch.run), for each grid, every rank builds both
(`parlab.compose.titan.compare.build`): the course's composition (`parlab.compose.setup`:
its own TP, SP, DDP and 1F1B) and the torchtitan-style one (`parlab.compose.titan`: one
DeviceMesh, `parallelize_module` TP + SP, `fully_shard`, a `torch.distributed.pipelining`
stage and schedule). They must first agree: the global losses of steps 0 and 1 within
`parlab.compose.TOLERANCE` of each other. Then rank by rank: the bytes it sent in step 1
(`parlab.compose.titan.traffic.step_traffic`: parlab.comm's tracer for torch.distributed's
calls, a dispatch mode for DTensor's functional collectives, which the tracer does not see),
the weights, gradients and Adam moments it holds (`state_bytes`), the two taking turns for the
median milliseconds per step (benchmarks/_table.py) and the ratio composed / torch API
(below 1: the course's faster), and, in fresh ranks, the peak RSS of one step above the RSS
before it (benchmarks/_memory.py). Bytes, state and peak are the largest rank's; times the
slowest rank's. TORCH_DISTRIBUTED_DEBUG is OFF for both (`_table.no_debug_checks`).
"""

from __future__ import annotations

import itertools

import torch.distributed as dist
from _memory import mib, peak_above
from _table import Table, interleave, medians, ms, ratio, repeats_option, setting, unwatched

from parlab.compose import TOLERANCE, Plan
from parlab.compose.titan.compare import BUILDS, build
from parlab.compose.titan.traffic import state_bytes, step_traffic
from parlab.launch import run
from parlab.model import LlamaConfig

CFG, LR = LlamaConfig(), 3e-3
GRIDS = [Plan(dp=2, pp=2, micro_batch_size=2),
         Plan(dp=2, tp=2, sequence_parallel=True, micro_batch_size=2),
         Plan(pp=2, tp=2, sequence_parallel=True, micro_batch_size=2)]


def worker(plan: Plan, repeats: int) -> dict:
    """In each rank: both builds, their losses of steps 0-1, step 1's bytes, the times."""
    builds = {name: build(name, CFG, plan, lr=LR) for name in BUILDS}
    losses, sent, dtensor, held, steps = {}, {}, {}, {}, {}
    for name, (step, state) in builds.items():
        losses[name] = [step(0)]
        traffic = step_traffic(lambda step=step, name=name: losses[name].append(step(1)))
        sent[name], dtensor[name] = traffic.total, traffic.funcol
        held[name] = sum(state_bytes(*state).values())
        counter = itertools.count(2)
        steps[name] = lambda step=step, counter=counter: step(next(counter))
    gap = max(abs(a - b) for a, b in zip(*losses.values(), strict=True))
    if gap > TOLERANCE:
        raise AssertionError(f"the builds disagree: loss gap {gap:.1e} > {TOLERANCE:.0e}")
    with unwatched():
        times = medians(interleave(steps, repeats, sync=dist.barrier))
    return {"gap": gap, "sent": sent, "dtensor": dtensor, "held": held, "times": times}


def memory_worker(plan: Plan) -> dict:
    peaks = {}
    for name in BUILDS:
        step, _ = build(name, CFG, plan, lr=LR)
        counter = itertools.count()
        with unwatched():
            dist.barrier()
            peaks[name] = peak_above(lambda step=step, counter=counter: step(next(counter)))
    return peaks


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(
        f"Llama training step ({CFG.layers} layers, hidden {CFG.hidden}, vocabulary "
        f"{CFG.vocab}, sequence {CFG.seq}, global batch 8, AdamW), 4 ranks, ms per step "
        "(slowest rank); bytes the busiest rank sends in a step (parlab.comm's tracer + a "
        "dispatch mode for DTensor's collectives), weights + gradients + Adam bytes per rank "
        "and peak MiB of a step (RSS above the rank's before it), largest rank", repeats),
        ["grid", "composed ms", "torch API ms", "composed / torch API",
         "bytes sent: composed / torch API (DTensor's)", "state bytes: composed / torch API",
         "composed peak MiB", "torch API peak MiB", "loss gap"])
    for plan in GRIDS:
        results = run(worker, 4, plan, repeats, timeout=600)
        peaks = run(memory_worker, 4, plan, timeout=600)
        times = {n: max(r["times"][n] for r in results) for n in BUILDS}
        sent = {n: max(r["sent"][n] for r in results) for n in BUILDS}
        held = {n: max(r["held"][n] for r in results) for n in BUILDS}
        peak = {n: max(p[n] for p in peaks) for n in BUILDS}
        a, b = BUILDS
        table.add(f"dp={plan.dp} pp={plan.pp} tp={plan.tp}"
                  + (" SP" if plan.sequence_parallel else ""),
                  ms(times[a]), ms(times[b]), ratio(times[a], times[b]),
                  f"{sent[a]:,.0f} / {sent[b]:,.0f} "
                  f"({max(r['dtensor'][b] for r in results):,.0f})",
                  f"{held[a]:,} / {held[b]:,}", mib(peak[a]), mib(peak[b]),
                  f"{max(r['gap'] for r in results):.1e}")
    table.emit("titan")


if __name__ == "__main__":
    main()
