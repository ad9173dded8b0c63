r"""How long one step of a plan takes: compute, the exposed comms of each axis, the bubble.

`step_times` is step 4 of `parlab.plan.planner`'s recipe (see its docstring): compute at the
cluster's achievable share of peak, times the busiest stage's share; TP, EP and PP traffic
over its link; CP as far as attention does not hide it (`plan_costs.cp_seconds`); DualPipe-V's
pairs hiding a share of EP and CP (`plan_costs.pair_hidden_share`); the pipeline's bubble
(`plan_costs.bubble_seconds`); and the DP traffic its window cannot hide.
"""

from __future__ import annotations

from parlab.plan.costs import bubble_seconds, cp_seconds, pair_hidden_share, stage_imbalance
from parlab.plan.types import AxisTraffic, Cluster, Model, Shape

__all__ = ["peak_seconds", "step_times"]

_WINDOW = {"ddp": 2 / 3, "zero1": 1.0}  # share of one micro-batch's compute that hides DP


def peak_seconds(model: Model, cluster: Cluster, tokens: float) -> float:
    """Seconds a step's 6·N_act FLOPs per token take on every GPU at peak FLOP/s."""
    return 6 * model.active_params * tokens / (cluster.gpus * cluster.flops)


def step_times(model: Model, cluster: Cluster, s: Shape, traffic: tuple[AxisTraffic, ...], *,
               strategy: str, recompute: str, tokens: float, m: int, micro_batch: int = 1,
               cp_kind: str = "ring", schedule: str = "1f1b"
               ) -> tuple[dict[str, float], float]:
    """({part: seconds} of one step, which sum to it; the bubble's share of the step)."""
    useful = peak_seconds(model, cluster, tokens) / cluster.achievable
    compute = useful * (8 / 6 if recompute == "full" else 1.0) * stage_imbalance(model, s.pp)
    times = {"compute useful": useful, "compute overhead": compute - useful}
    for t in traffic:
        if t.axis != "dp":
            times[f"{t.axis.upper()} comms"] = t.seconds
    cp = next((t for t in traffic if t.axis == "cp"), None)
    if cp is not None:
        times["CP comms"] = cp_seconds(model, cluster, s, cp_kind=cp_kind,
                                       micro_batch=micro_batch, microbatches=m,
                                       bandwidth=cp.bandwidth)
    overlapped = sum(times.get(k, 0.0) for k in ("EP comms", "CP comms"))
    if overlapped and schedule == "dualpipe_v":  # pairs hide it under the other chunk's work
        keep = 1 - pair_hidden_share(s.pp, m, schedule) * min(1.0, compute / overlapped)
        for k in ("EP comms", "CP comms"):
            if k in times:
                times[k] *= keep
    busy = sum(times.values())
    times["PP bubble"] = bubble_seconds(busy, s.pp, m, schedule)
    bubble = times["PP bubble"] / (busy + times["PP bubble"])
    window = compute * (_WINDOW[strategy] / m if strategy in _WINDOW else 1.0)
    dp = next(t for t in traffic if t.axis == "dp")
    times["DP exposed"] = max(0.0, dp.seconds - window)
    return times, bubble
