r"""A parallelism planner: every DP × TP × PP (× CP × EP) shape of a cluster, ranked.

The recipe module 07 teaches, as code: work memory-first, then comms.

    from parlab import plan
    plans = plan.plan(plan.LLAMA3_405B, plan.LLAMA3_CLUSTER, global_batch=2048)
    print(plan.table(plans))                      # best first; rejected ones last, with why
    one = plan.evaluate(plan.PRACTICE_70B, plan.H100_32, dp=4, tp=8, global_batch=1024)
    one.memory, one.traffic, one.bubble, one.reasons

For each shape $(d, t, p, c, e)$ with $dtpce$ = GPUs, each ZeRO strategy and each recompute
policy, `evaluate`:
1. checks the shape divides the model: t | heads, p ≤ L, c | s, e | E, and the global batch B
   (sequences) splits into $m = B / (d\,e\,b)$ micro-batches of b for every pipeline;
   Ulysses CP (`cp_kind="ulysses"`) needs c to divide the query and key/value heads of a TP
   rank (it caps at the head count), DualPipe-V (`schedule="dualpipe_v"`) m ≥ 2p;
2. memory per GPU of the fullest stage (`plan_costs.fullest_stage`: the first stage's
   activations or the last stage's fp32 logits, whichever weigh more), against `usable` ×
   memory; `precision="fp8"` keeps the GEMM inputs among the activations in FP8 and sends
   TP's all-gathers and ZeRO-3's weight all-gathers in FP8 (`parlab.costs.precision`);
3. places each axis on the rank grid (`parlab.mesh`, TP innermost) and reads the link its
   groups ride; TP groups that leave a node are rejected (rule 1 of the placement heuristics:
   its collectives sit between dependent GEMMs);
4. times a step. Compute $T_c = f N_{act} B s / (G a F)$ ($f = 6$ FLOPs per token and
   parameter, 8 with full recomputation, which runs the forward twice; $a$ =
   `Cluster.achievable`, the share of the peak F the matmuls sustain) times the busiest
   stage's share (`plan_costs.stage_imbalance`); TP, EP and PP bytes over their link's
   bandwidth lie on the critical path, CP's as far as attention does not hide them
   (`plan_costs.cp_seconds`: ring attention hides a step's transfer behind its block, Ulysses
   hides nothing) and, with $T_c$, make the busy time W; DualPipe-V hides a share of the EP
   and CP time in its overlapped pairs (`plan_costs.pair_hidden_share`); the pipeline adds
   its bubble, 1F1B's $W\frac{\beta}{1-\beta}$, $\beta$ = `costs.bubble_fraction(p, m)`
   (the step is $W\frac{m+p-1}{m}$ before DP), or DualPipe-V's third of it
   (`plan_costs.bubble_seconds`); DP shows only what its window cannot hide:
   the last micro-batch's backward (ddp, $\frac{2}{3}T_c/m$), its forward and backward
   (zero1, $T_c/m$), or the whole step (zero2, zero3, which send every micro-batch).
Kept plans are ranked by step time (then memory); rejected ones follow with their reasons.

MFU (`Plan.mfu`, defined in `parlab.plan.types`) is the step's $6N_{act}$ FLOPs per token at
peak over the step time, so it is at most `achievable`; published runs report 38-52%.

Where the model is rough: compute is $6N$ per token (no attention-score FLOPs) at one assumed
share of peak for every kernel, so step times and MFU are optimistic; links are bandwidth only
(no latency, no contention between axes sharing a NIC, one NIC per GPU); EP traffic is
counted as exposed except in DualPipe-V's pairs; a PP group is
called inter-node if any of its ranks sits on another node, though only neighbours talk;
activations use the GPT-style 34·sbh per layer (SwiGLU, GQA and MLA change it), MoE layers' as
if dense; stages take ⌈L/p⌉ layers (Llama 3 trims the first and last stage instead); no
interleaved schedule (v = 1), so deep pipelines with few micro-batches pay the full bubble;
FP8 changes memory and bytes only: its faster GEMMs are not credited to the compute time.
"""

from __future__ import annotations

import math

from parlab import costs
from parlab.mesh import make_mesh
from parlab.plan.costs import (
    CP_KINDS,
    DP_GROUP,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    axis_bytes,
    fullest_stage,
    nodes_spanned,
    stage_layers,
    tp_heads,
)
from parlab.plan.presets import (
    DEEPSEEK_CLUSTER,
    DEEPSEEK_V3,
    H100_32,
    H100_512,
    LLAMA3_405B,
    LLAMA3_CLUSTER,
    MEGATRON_1T,
    MEGATRON_CLUSTER,
    MODEL_512,
    PRACTICE_70B,
    PRESETS,
    SEED_70B,
)
from parlab.plan.timing import peak_seconds, step_times
from parlab.plan.types import AxisTraffic, Cluster, Model, Plan, Shape

__all__ = ["Model", "Cluster", "AxisTraffic", "Plan", "evaluate", "plan", "best", "table",
           "STRATEGIES", "RECOMPUTE", "PRESETS", "PRACTICE_70B", "SEED_70B", "H100_32",
           "MODEL_512", "H100_512", "LLAMA3_405B", "LLAMA3_CLUSTER", "MEGATRON_1T",
           "MEGATRON_CLUSTER", "DEEPSEEK_V3", "DEEPSEEK_CLUSTER"]

STRATEGIES = ("ddp", "zero1", "zero3")
"""The data-parallel strategies `plan` tries by default (fsdp is zero3 under another name).
zero2 is left out: with gradient accumulation it reduce-scatters every micro-batch, moving up
to m times zero1's bytes to save only the gradients' share of the state, and the step-time
model, which lets the whole step hide that traffic, would rank it level with zero1. Pass
`strategies=` to include it."""
_AXIS_GROUPS = {"tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",), "dp": DP_GROUP}


def _check_options(strategy: str, recompute: str, global_batch: int, micro_batch: int,
                   usable: float, cp_kind: str = "ring", schedule: str = "1f1b",
                   precision: str = "bf16") -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    if cp_kind not in CP_KINDS:
        raise ValueError(f"cp_kind={cp_kind!r}: use one of {', '.join(CP_KINDS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: use one of {', '.join(SCHEDULES)}")
    if strategy not in costs.STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {', '.join(costs.STRATEGIES)}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: use one of {', '.join(RECOMPUTE)}")
    for name, value in (("global_batch", global_batch), ("micro_batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of sequences >= 1, got {value!r}")
    if isinstance(usable, bool) or not isinstance(usable, (int, float)) or not 0 < usable <= 1:
        raise ValueError(f"usable={usable!r} is the share of GPU memory a plan may fill: "
                         "pass a number in (0, 1], e.g. 0.9")


def _variant_problems(model: Model, s: Shape, m: int, cp_kind: str, schedule: str) -> list[str]:
    out = []
    q, kv = tp_heads(model, s.tp)
    if cp_kind == "ulysses" and s.cp > 1 and (q % s.cp or kv % s.cp):
        out.append(f"Ulysses CP {s.cp} needs whole heads on every rank, but a TP rank holds "
                   f"{q} query and {kv} key/value heads: Ulysses caps at the head count (use "
                   "ring attention, or a degree dividing both)")
    if schedule == "dualpipe_v" and m < 2 * s.pp:
        out.append(f"DualPipe-V needs m >= 2p micro-batches per pipeline: m = {m} for "
                   f"p = {s.pp}")
    return out


def _shape_problems(model: Model, s: Shape, global_batch: int, micro_batch: int) -> list[str]:
    out = []
    if model.heads % s.tp or model.hidden % s.tp:
        out.append(f"{model.heads} heads (hidden {model.hidden}) not divisible by tp={s.tp}: "
                   "TP splits attention by heads and the MLP by columns")
    if s.pp > model.layers:
        out.append(f"pp={s.pp} stages for {model.layers} layers: a stage would hold no layer")
    if model.seq % s.cp:
        out.append(f"sequence {model.seq} not divisible by cp={s.cp}")
    if s.ep > 1 and (not model.experts or model.experts % s.ep):
        out.append(f"{model.experts} experts cannot be split over ep={s.ep}")
    replicas = s.dp * s.ep * micro_batch
    if global_batch % replicas:
        out.append(f"global batch {global_batch} not divisible into dp·ep = {s.dp * s.ep} "
                   f"replicas × micro-batches of {micro_batch}")
    return out


def _traffic(cluster: Cluster, s: Shape, nbytes: dict[str, float]) -> tuple[AxisTraffic, ...]:
    mesh = make_mesh(cluster.gpus, **s._asdict())
    out = []
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        size = math.prod(getattr(s, a) for a in _AXIS_GROUPS[axis])
        if size == 1 and axis != "dp":
            continue
        nodes = nodes_spanned(mesh, _AXIS_GROUPS[axis], cluster.gpus_per_node)
        bw = cluster.intra_bw if nodes == 1 else cluster.inter_bw
        name = cluster.intra_name if nodes == 1 else cluster.inter_name
        out.append(AxisTraffic(axis, size, nbytes[axis], nodes, name, bw, nbytes[axis] / bw))
    return tuple(out)


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def _judge(cluster: Cluster, memory: dict[str, float], capacity: float,
           traffic: tuple[AxisTraffic, ...], usable: float, stage: str
           ) -> tuple[list[str], list[str]]:
    """(failures, notes): memory first, then the links."""
    total, act, logits = sum(memory.values()), memory["activations"], memory["logits"]
    fails, notes = [], []
    where = (f"{_gb(total)} per GPU (state {_gb(total - act - logits)} + activations "
             f"{_gb(act)}" + (f" + fp32 logits {_gb(logits)}" if logits else "")
             + ("" if stage == "only" else f"; the {stage} stage") + ")")
    if total > capacity:
        fails.append(f"memory {where} > {_gb(capacity)} usable ({usable:.0%} of "
                     f"{_gb(cluster.memory)})")
    else:
        notes.append(f"fits: {where} of {_gb(capacity)} usable")
    for t in traffic:
        if t.axis == "tp" and not t.intra_node:
            fails.append(f"TP {t.size} spans {t.nodes} nodes: its per-layer collectives would "
                         f"ride the {cluster.inter_bw / 1e9:,.4g} GB/s {t.link} link")
        elif t.size > 1:
            notes.append(f"{t.axis.upper()} {t.size} on {t.link}"
                         + (" inside a node" if t.intra_node else f" across {t.nodes} nodes")
                         + f": {_gb(t.nbytes)} per GPU per step, {t.seconds:.3g} s")
    return fails, notes


def evaluate(model: Model, cluster: Cluster, *, dp: int, tp: int = 1, pp: int = 1, cp: int = 1,
             ep: int = 1, strategy: str = "zero1", recompute: str = "selective",
             global_batch: int, micro_batch: int = 1, usable: float = 0.9,
             cp_kind: str = "ring", schedule: str = "1f1b", precision: str = "bf16",
             regather: bool = True) -> Plan:
    """One plan, judged. Raises ValueError when the sizes do not multiply to cluster.gpus or
    an option is unknown; a shape the model cannot take (tp not dividing the heads, ...) comes
    back as a rejected Plan saying why. cp_kind: "ring" or "ulysses"; schedule: "1f1b" or
    "dualpipe_v"; precision: "bf16" or "fp8"; regather: TP + SP as Megatron runs it (True: the
    QKV and fc1 inputs kept as shards and gathered again in backward, 20 (t-1)/t bsh a layer)
    or with those inputs kept gathered (False: plain TP's 16 (t-1)/t bsh, 4 (t-1)/t sbh more
    activations a layer)."""
    _check_options(strategy, recompute, global_batch, micro_batch, usable, cp_kind, schedule,
                   precision)
    s = Shape(dp=dp, pp=pp, ep=ep, cp=cp, tp=tp)
    if math.prod(s) != cluster.gpus:
        raise ValueError(f"dp·pp·ep·cp·tp = {' × '.join(map(str, s))} = {math.prod(s)} but "
                         f"{cluster.name} has {cluster.gpus} GPUs: pick sizes whose product "
                         "is the number of GPUs")
    problems = _shape_problems(model, s, global_batch, micro_batch)
    m = max(1, global_batch // (dp * ep * micro_batch))
    problems += _variant_problems(model, s, m, cp_kind, schedule)
    stage, memory = fullest_stage(model, s, strategy=strategy, micro_batch=micro_batch,
                                  microbatches=m, recompute=recompute, schedule=schedule,
                                  precision=precision, regather=regather)
    nbytes = axis_bytes(model, s, strategy=strategy, micro_batch=micro_batch, microbatches=m,
                        cp_kind=cp_kind, schedule=schedule, precision=precision,
                        regather=regather)
    traffic = _traffic(cluster, s, nbytes)
    times, bubble = step_times(model, cluster, s, traffic, strategy=strategy, recompute=recompute,
                           tokens=global_batch * model.seq, m=m, micro_batch=micro_batch,
                           cp_kind=cp_kind, schedule=schedule)
    capacity = usable * cluster.memory
    fails, notes = _judge(cluster, memory, capacity, traffic, usable, stage)
    if pp > 1:
        notes.append(f"bubble {bubble:.1%} with m = {m} micro-batches over {pp} "
                     + (f"ranks of two chunks each (DualPipe-V, {2 * pp} stages)"
                        if schedule == "dualpipe_v" else "stages")
                     + f" of up to {stage_layers(model, pp)} layers")
    if cp > 1:
        notes.append(f"CP {cp} by {'Ulysses' if cp_kind == 'ulysses' else 'ring attention'}: "
                     f"{times.get('CP comms', 0.0):.3g} s exposed of "
                     f"{nbytes['cp'] / 1e9:,.1f} GB sent")
    fails = problems + fails
    return Plan(dp, tp, pp, cp, ep, strategy, recompute, micro_batch, m, memory, capacity,
                traffic, bubble, times, kept=not fails, reasons=tuple(fails or notes),
                peak_compute_s=peak_seconds(model, cluster, global_batch * model.seq),
                cp_kind=cp_kind, schedule=schedule, precision=precision, stage=stage)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _shapes(model: Model, cluster: Cluster, cp_sizes: tuple[int, ...], max_tp: int
            ) -> list[Shape]:
    g = cluster.gpus
    eps = _divisors(math.gcd(g, model.experts)) if model.experts else [1]
    return [Shape(g // (t * p * c * e), p, e, c, t)
            for t in _divisors(g) if t <= max_tp
            for p in _divisors(g) if p <= model.layers
            for c in cp_sizes for e in eps if g % (t * p * c * e) == 0]


def plan(model: Model, cluster: Cluster, *, global_batch: int, micro_batch: int = 1,
         strategies: tuple[str, ...] = STRATEGIES,
         recompute: tuple[str, ...] = ("selective", "full"), cp_sizes: tuple[int, ...] = (1,),
         max_tp: int | None = None, usable: float = 0.9,
         cp_kinds: tuple[str, ...] = ("ring",),
         schedules: tuple[str, ...] = ("1f1b",), precision: str = "bf16") -> list[Plan]:
    """Every plan with tp ≤ max_tp (default two nodes' worth, to show why TP stays home),
    p ≤ L, c in cp_sizes (each by every kind in cp_kinds), e dividing the experts, every
    schedule in schedules for p > 1, all in one `precision`: kept ones by step time, then
    rejected ones (fewest failed checks first)."""
    max_tp = max_tp or 2 * cluster.gpus_per_node
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in (*cp_sizes, max_tp)):
        raise ValueError(f"cp_sizes={cp_sizes!r} and max_tp={max_tp!r} must be whole numbers "
                         ">= 1, e.g. cp_sizes=(1, 2, 4)")
    plans = [evaluate(model, cluster, **s._asdict(), strategy=st, recompute=rc,
                      global_batch=global_batch, micro_batch=micro_batch, usable=usable,
                      cp_kind=kind, schedule=sched, precision=precision)
             for s in _shapes(model, cluster, cp_sizes, max_tp)
             for kind in (cp_kinds if s.cp > 1 else cp_kinds[:1])
             for sched in (schedules if s.pp > 1 else schedules[:1])
             for st in strategies for rc in recompute]
    return sorted(plans, key=lambda p: (not p.kept, 0 if p.kept else len(p.reasons),
                                        p.step_s, p.memory_total))


def best(plans: list[Plan]) -> Plan | None:
    """The first kept plan of a ranked list, or None when nothing fits."""
    return next((p for p in plans if p.kept), None)


def table(plans: list[Plan], *, kept: int = 5, rejected: int = 5) -> str:
    """Plain-text ranking: the top `kept` plans, then `rejected` rejected ones with reasons."""
    rows = [f"{'plan':52} {'GB/GPU':>7} {'bubble':>7} {'step s':>8} {'MFU':>5}"]
    good = [p for p in plans if p.kept][:kept]
    bad = [p for p in plans if not p.kept][:rejected]
    for p in good + bad:
        rows.append(f"{p.label:52} {p.memory_total / 1e9:7.1f} {p.bubble:7.1%} "
                    f"{p.step_s:8.2f} {p.mfu:5.0%}" + ("" if p.kept else "  REJECTED"))
        rows.extend(f"    - {r}" for r in p.reasons)
    return "\n".join(rows)
