"""The planner against closed forms worked out here by hand, and module 07's worked answers."""

from __future__ import annotations

import dataclasses
import math

import pytest

from parlab import plan
from parlab.plan import Cluster, Model

GB = 1e9
STATE = ("weights", "gradients", "optimizer state")


def state(p: plan.Plan) -> float:
    return sum(p.memory[k] for k in STATE)


def seed70(**kw) -> plan.Plan:
    return plan.evaluate(plan.PRACTICE_70B, plan.H100_32, global_batch=1024, **kw)


# --- practice problem 1: 70B on 32 H100s -------------------------------------------------------

def test_70b_pure_ddp_is_rejected_for_memory():
    p = seed70(dp=32, strategy="ddp")
    assert state(p) == pytest.approx(70e9 * (2 + 2 + 12))  # 1120 GB on every GPU
    assert not p.kept
    assert p.reasons[0].startswith("memory 1,211.3 GB per GPU (state 1,120.0 GB")
    assert "> 72.0 GB usable" in p.reasons[0]


def test_70b_zero3_over_32_fits_at_35_gb_of_state():
    p = seed70(dp=32, strategy="zero3", recompute="full")
    s, h, layers = 4096, 8192, 80
    assert state(p) == pytest.approx(1120e9 / 32)  # 35 GB
    assert p.memory["gathered weights"] == pytest.approx(2 * 2 * 70e9 / layers)
    # full recomputation: every layer keeps its bf16 input, one layer is rebuilt at a time
    assert p.memory["activations"] == pytest.approx(layers * 2 * s * h + 34 * s * h)
    assert p.kept and p.memory_total < 0.9 * 80e9
    assert p.axis("dp").nodes == 4 and p.axis("dp").link == "InfiniBand"
    # keeping every activation (34 sbh a layer) does not fit: 80 layers of 1.14 GB
    keep_all = seed70(dp=32, strategy="zero3", recompute="selective")
    assert keep_all.memory["activations"] == pytest.approx(layers * 34 * s * h)
    assert not keep_all.kept and keep_all.reasons[0].startswith("memory")


def test_70b_tp8_inside_a_node_dp4_across_nodes():
    p = seed70(dp=4, tp=8, strategy="zero1", recompute="full")
    tp, dp = p.axis("tp"), p.axis("dp")
    assert (tp.nodes, tp.link, tp.bandwidth) == (1, "NVLink", 450e9)
    assert (dp.nodes, dp.link, dp.bandwidth) == (4, "InfiniBand", 50e9)
    m = 1024 // 4
    assert p.microbatches == m
    # TP + SP as Megatron runs it: 6 ring all-gathers (2 of them the backward's re-gathers of
    # the LayerNorm outputs) and 4 ring reduce-scatters of b·s·h bf16, each (t-1)/t of it
    per_layer = (6 + 4) * 7 / 8 * (4096 * 8192 * 2)
    assert tp.nbytes == pytest.approx(m * 80 * per_layer)
    assert tp.seconds == pytest.approx(tp.nbytes / 450e9)
    assert dp.nbytes == pytest.approx(2 * 3 / 4 * 2 * 70e9 / 8)  # one all-reduce of bf16 grads
    assert state(p) == pytest.approx(4 * 70e9 / 8 + 12 * 70e9 / 8 / 4)
    assert p.kept
    assert any("TP 8 on NVLink inside a node" in r for r in p.reasons)


def test_tp_that_leaves_the_node_is_rejected():
    p = seed70(dp=2, tp=16, strategy="zero3", recompute="full")
    assert p.axis("tp").nodes == 2 and p.axis("tp").link == "InfiniBand"
    assert not p.kept
    assert any(r.startswith("TP 16 spans 2 nodes") and "50 GB/s" in r for r in p.reasons)


# --- the quiz: 512 H100s as TP 8 × PP 8 × DP 8 -------------------------------------------------

def test_512_h100_tp8_pp8_dp8():
    p = plan.evaluate(plan.MODEL_512, plan.H100_512, dp=8, tp=8, pp=8, global_batch=1920)
    assert p.kept
    assert p.axis("tp").nodes == 1 and p.axis("tp").link == "NVLink"
    assert p.axis("pp").nodes == 8 and p.axis("pp").link == "InfiniBand"  # ranks 0, 8, .., 56
    assert p.axis("dp").nodes == 8 and p.axis("dp").link == "InfiniBand"  # ranks 0, 64, .., 448
    m, s, h, t = 1920 // 8, 2048, 20480, 8
    assert p.axis("pp").nbytes == pytest.approx(m * 2 * (2 * s * h / t))  # act fwd, grad bwd
    assert p.bubble == pytest.approx(7 / (m + 7))
    top = plan.best(plan.plan(plan.MODEL_512, plan.H100_512, global_batch=1920))
    assert (top.tp, top.pp, top.dp, top.cp, top.ep) == (8, 8, 8, 1, 1)


# --- practice problem 2: TP bytes per layer, PP micro-batches for a 15% bubble -----------------

def test_practice_problem_2():
    model = Model("h8192", 8 * 12 * 8192**2, layers=8, hidden=8192, heads=64, seq=8192)
    cluster = Cluster("64 H100", gpus=64, gpus_per_node=8, memory=80e9, intra_bw=450e9,
                      inter_bw=50e9, flops=1e15)
    per_layer = 4 * 2 * 7 / 8 * (1 * 8192 * 8192 * 2)
    assert per_layer == 896 * 2**20  # 4 × 224 MiB: the worked answer's "~896 MB"
    p = plan.evaluate(model, cluster, dp=1, tp=8, pp=8, global_batch=40)
    assert p.microbatches == 40
    # the planner's TP + SP re-gathers the LayerNorm outputs in backward: 10 of the 8 (t-1)/t
    # collectives' worth, 1120 MiB a layer; without the re-gather, the worked answer's 896
    assert p.axis("tp").nbytes == pytest.approx(40 * 1 * per_layer * 10 / 8)  # 1 layer a stage
    kept = plan.axis_bytes(model, plan.Shape(1, 8, 1, 1, 8), strategy="ddp", micro_batch=1,
                           microbatches=40, regather=False)
    assert kept["tp"] == pytest.approx(40 * per_layer)
    # ~2.6 ms a layer at 450 GB/s each way (2.1 ms without the re-gathers); the worked
    # answer's ~1.0 ms divides 896 MiB by 900 GB/s
    assert p.axis("tp").seconds / 40 == pytest.approx(1120 * 2**20 / 450e9)
    assert p.bubble == pytest.approx(7 / 47) and p.bubble <= 0.15
    fewer = plan.evaluate(model, cluster, dp=1, tp=8, pp=8, global_batch=39)
    assert fewer.bubble == pytest.approx(7 / 46) and fewer.bubble > 0.15


def test_sp_that_keeps_its_gathered_inputs_trades_bytes_for_memory():
    """regather=False: the QKV and fc1 GEMMs keep the gathered LayerNorm outputs (4 sbh in bf16,
    whole) instead of their shards (4 sbh / t) and skip the backward's two re-gathers: plain
    TP's 16 (t-1)/t bsh instead of 20, and 4 (t-1)/t sbh more a layer and micro-batch held."""
    model = Model("h8192", 8 * 12 * 8192**2, layers=8, hidden=8192, heads=64, seq=8192)
    cluster = Cluster("64 H100", gpus=64, gpus_per_node=8, memory=80e9, intra_bw=450e9,
                      inter_bw=50e9, flops=1e15)
    one = {"dp": 1, "tp": 8, "pp": 8, "global_batch": 40, "recompute": "selective"}
    megatron = plan.evaluate(model, cluster, **one)
    kept = plan.evaluate(model, cluster, **one, regather=False)
    sbh, t = 8192 * 8192, 8
    assert kept.axis("tp").nbytes == pytest.approx(megatron.axis("tp").nbytes * 16 / 20)
    # the first stage holds min(p, m) = 8 micro-batches of its one layer
    extra = kept.memory["activations"] - megatron.memory["activations"]
    assert extra == pytest.approx(8 * 1 * 4 * (t - 1) / t * sbh)
    assert megatron.memory["activations"] == pytest.approx(8 * 34 * sbh / t)


# --- published configurations -------------------------------------------------------------------

@pytest.mark.parametrize("model, cluster, batch, published", [
    (plan.LLAMA3_405B, plan.LLAMA3_CLUSTER, 2048, {"tp": 8, "pp": 16, "dp": 128}),
    (plan.MEGATRON_1T, plan.MEGATRON_CLUSTER, 3072, {"tp": 8, "pp": 64, "dp": 6}),
])
def test_published_configurations(model, cluster, batch, published):
    top = plan.best(plan.plan(model, cluster, global_batch=batch))
    assert top.kept and top.memory_total <= 0.9 * cluster.memory
    assert top.tp > 1 and top.axis("tp").intra_node
    theirs = plan.evaluate(model, cluster, **published, strategy="zero1", recompute="full",
                           global_batch=batch)
    assert theirs.kept and theirs.axis("tp").intra_node
    assert not theirs.axis("pp").intra_node and not theirs.axis("dp").intra_node


def test_moe_expert_parallel_bytes_and_link():
    p = plan.evaluate(plan.DEEPSEEK_V3, plan.DEEPSEEK_CLUSTER, dp=2, pp=16, ep=64,
                      recompute="full", global_batch=15360)
    ep = p.axis("ep")
    assert ep.nodes == 8 and ep.link == "InfiniBand"  # 64 consecutive ranks
    m, tokens, k, experts, h = 15360 // (2 * 64), 4096, 8, 256, 7168
    capacity = math.ceil(tokens * k / experts)  # 128 slots per expert
    buffer = experts * capacity * h * 2
    per_layer = 2 * 2 * 63 / 64 * buffer  # dispatch + combine, forward and backward
    assert ep.nbytes == pytest.approx(m * math.ceil(58 / 16) * per_layer)
    assert p.axis("dp").size == 128  # dense weights are shared by dp × ep ranks
    dense_layer = (671e9 - plan.DEEPSEEK_V3.expert_params - 2 * 129280 * h) / 61
    dense = 4 * dense_layer + 129280 * h  # 4 layers and the embedding on stage 0
    expert = plan.DEEPSEEK_V3.expert_params * 4 / 61 / 64
    assert p.memory["weights"] == pytest.approx(2 * (dense + expert))
    assert p.memory["optimizer state"] == pytest.approx(12 * (dense / 128 + expert / 2))


# --- links from the rank grid -------------------------------------------------------------------

def small(gpus: int, per_node: int) -> tuple[Model, Cluster]:
    model = Model("small", 1e9, layers=12, hidden=768, heads=12, seq=1024)
    return model, Cluster("small", gpus=gpus, gpus_per_node=per_node, memory=80e9,
                          intra_bw=450e9, inter_bw=50e9, flops=1e15)


def test_each_axis_is_placed_on_the_link_its_groups_ride():
    model, cluster = small(8, 4)
    p = plan.evaluate(model, cluster, dp=1, tp=2, pp=4, global_batch=8)
    assert p.axis("tp").intra_node  # [0, 1] [2, 3] ...
    assert p.axis("pp").nodes == 2 and p.axis("pp").link == "InfiniBand"  # [0, 2, 4, 6]
    q = plan.evaluate(model, cluster, dp=2, tp=2, pp=2, global_batch=8)
    assert q.axis("pp").intra_node and q.axis("dp").nodes == 2  # pp [0, 2]; dp [0, 4]
    model, cluster = small(12, 4)
    r = plan.evaluate(model, cluster, dp=4, tp=3, global_batch=8)
    assert r.axis("tp").nodes == 2 and not r.kept  # [3, 4, 5] straddles nodes 0 and 1


def test_compute_time_and_recompute_overhead():
    model, cluster = small(8, 8)
    assert cluster.achievable == plan.ACHIEVABLE == 0.6
    p = plan.evaluate(model, cluster, dp=8, global_batch=64, strategy="ddp")
    at_peak = 6 * 1e9 * 64 * 1024 / (8 * 1e15)  # 6N FLOPs per token, 64 × 1024 tokens
    useful = at_peak / 0.6  # the matmuls run at 60% of peak
    assert p.times["compute useful"] == pytest.approx(useful)
    assert p.times["compute overhead"] == pytest.approx(0)
    q = plan.evaluate(model, cluster, dp=8, global_batch=64, strategy="ddp", recompute="full")
    assert q.times["compute overhead"] == pytest.approx(useful / 3)  # 8N instead of 6N
    # MFU: model FLOPs per second over the peak; the recomputed forward does not count
    tokens_per_s = 64 * 1024 / p.step_s
    assert p.mfu == pytest.approx(6 * 1e9 * tokens_per_s / (8 * 1e15))
    assert p.mfu <= 0.6 and q.mfu < p.mfu
    fast = Cluster("small", gpus=8, gpus_per_node=8, memory=80e9, intra_bw=450e9,
                   inter_bw=50e9, flops=1e15, achievable=1.0)
    at_full = plan.evaluate(model, fast, dp=8, global_batch=64, strategy="ddp")
    assert at_full.times["compute useful"] == pytest.approx(at_peak)


def test_dp_traffic_and_what_its_window_hides():
    model, cluster = small(16, 8)
    m, useful = 8, 6 * 1e9 * 128 * 1024 / (16 * 1e15) / 0.6
    ddp = plan.evaluate(model, cluster, dp=16, global_batch=128, strategy="ddp")
    assert ddp.axis("dp").nbytes == pytest.approx(2 * 15 / 16 * 2e9)  # once a step
    hidden = 2 / 3 * useful / m  # the last micro-batch's backward
    assert ddp.times["DP exposed"] == pytest.approx(ddp.axis("dp").seconds - hidden)
    z2 = plan.evaluate(model, cluster, dp=16, global_batch=128, strategy="zero2")
    assert z2.axis("dp").nbytes == pytest.approx((m + 1) * 15 / 16 * 2e9)  # RS each, AG once
    z3 = plan.evaluate(model, cluster, dp=16, global_batch=128, strategy="zero3")
    assert z3.axis("dp").nbytes == pytest.approx(m * 3 * 15 / 16 * 2e9)  # every micro-batch
    assert z3.times["DP exposed"] == pytest.approx(max(0, z3.axis("dp").seconds - useful))


def test_1f1b_first_stage_holds_min_p_m_microbatches():
    model, cluster = small(8, 8)
    per_layer = 34 * 1024 * 768  # selective recompute, t = 1
    few = plan.evaluate(model, cluster, dp=1, pp=8, global_batch=4)  # m = 4 < p
    many = plan.evaluate(model, cluster, dp=1, pp=8, global_batch=64)
    assert few.memory["activations"] == pytest.approx(4 * 2 * per_layer)  # 2 layers a stage
    assert many.memory["activations"] == pytest.approx(8 * 2 * per_layer)


# --- ranking and rejections ---------------------------------------------------------------------

def test_ranking_keeps_before_rejects_and_orders_by_step_time():
    plans = plan.plan(plan.PRACTICE_70B, plan.H100_32, global_batch=1024)
    kept = [p for p in plans if p.kept]
    assert plans[: len(kept)] == kept and kept and len(kept) < len(plans)
    assert [p.step_s for p in kept] == sorted(p.step_s for p in kept)
    assert all(p.reasons for p in plans)
    assert "REJECTED" in plan.table(plans) and kept[0].label in plan.table(plans)


def test_shapes_the_model_cannot_take_are_rejected_with_reasons():
    cluster = Cluster("24", gpus=24, gpus_per_node=8, memory=80e9, intra_bw=450e9,
                      inter_bw=50e9, flops=1e15)
    p = plan.evaluate(plan.PRACTICE_70B, cluster, dp=8, tp=3, global_batch=100)
    assert not p.kept
    assert any("64 heads" in r and "tp=3" in r for r in p.reasons)
    assert any("global batch 100" in r for r in p.reasons)


@pytest.mark.parametrize("kwargs, match", [
    ({"dp": 4}, "32 GPUs"),
    ({"dp": 32, "strategy": "zero4"}, "strategy"),
    ({"dp": 32, "recompute": "some"}, "recompute"),
    ({"dp": 32, "usable": 1.5}, "usable"),
    ({"dp": 32, "micro_batch": 0}, "micro_batch"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan.evaluate(plan.PRACTICE_70B, plan.H100_32, global_batch=1024, **kwargs)


@pytest.mark.parametrize("make, match", [
    (lambda: Model("m", 70e9, layers=0, hidden=8192, heads=64, seq=4096), "Model.layers"),
    (lambda: Model("m", 70, layers=80, hidden=8192, heads=64, seq=4096, vocab=32000),
     "n_params"),
    (lambda: Model("m", 70e9, layers=80, hidden=8192, heads=64, seq=4096, experts=8),
     "top_k and expert_params"),
    (lambda: Cluster("c", gpus=12, gpus_per_node=8, memory=80e9, intra_bw=1, inter_bw=1,
                     flops=1), "multiple of gpus_per_node"),
    (lambda: Cluster("c", gpus=8, gpus_per_node=8, memory=-1, intra_bw=1, inter_bw=1,
                     flops=1), "Cluster.memory"),
    (lambda: Cluster("c", gpus=8, gpus_per_node=8, memory=1, intra_bw=1, inter_bw=1,
                     flops=1, achievable=60), "Cluster.achievable"),
])
def test_bad_inputs_name_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- module 07's tables ---------------------------------------------------------------------------

def test_axis_table_has_one_scope_forward_and_backward():
    h, s, b, t = 8192, 4096, 1, 8
    act = b * s * h * 2  # one bf16 (b, s, h) activation
    rows = {r.axis: r.nbytes for r in plan.axis_rows(h, s, heads=64, ranks=t)}
    # TP + SP: 6 ring all-gathers (2 the backward's re-gathers) and 4 ring reduce-scatters
    assert rows["TP"] == pytest.approx((6 + 4) * (t - 1) / t * act)
    assert rows["PP"] == pytest.approx(2 * act)  # activation forward, gradient backward
    assert rows["DP"] == pytest.approx(2 * (t - 1) / t * 12 * h * h * 2)  # bf16 gradients
    # ring attention: K and V (act / c each) pass c - 1 hops forward; backward K and V again
    # c - 1 hops and the accumulators dK, dV c hops (one more, to get home)
    assert rows["CP"] == pytest.approx((2 * (t - 1) + 2 * (t - 1) + 2 * t) * act / t)
    # top-2 of 64 experts: capacity ceil(4096·2/64) = 128, E·c = 8192 rows of h each way
    buffer = 64 * 128 * h * 2
    assert rows["EP"] == pytest.approx(2 * 2 * (t - 1) / t * buffer)  # 2 all-to-alls, fwd+bwd
    table = plan.axis_table(h, s, heads=64, ranks=t)
    assert table.count("\n") == 6 and "| TP |" in table and "560 |" in table


def test_placement_table_prices_the_groups_the_given_function_counts():
    def spans(groups, gpn):  # written here: distinct nodes of the worst group
        return max(len({r // gpn for r in g}) for g in groups)

    sizes, traffic = {"dp": 8, "pp": 8, "tp": 8}, {"tp": 900e9, "pp": 50e9, "dp": 10e9}
    inner = plan.placement_table(sizes, ["tp", "pp", "dp"], traffic, plan.H100_512, spans)
    assert "| TP 8 | 1 | NVLink | 900.0 GB | 2.00 s |" in inner  # 900e9 / 450e9
    assert "| PP 8 | 8 | InfiniBand | 50.0 GB | 1.00 s |" in inner
    turned = plan.placement_table(sizes, ["dp", "pp", "tp"], traffic, plan.H100_512, spans)
    assert "| TP 8 | 8 | InfiniBand | 900.0 GB | 18.00 s |" in turned
    assert "| DP 8 | 1 | NVLink |" in turned
    calls = []
    plan.placement_table(sizes, ["tp", "pp", "dp"], traffic, plan.H100_512,
                         lambda g, n: calls.append((len(g), n)) or 1)
    assert calls == [(64, 8)] * 3  # 64 groups of 8 on each axis, 8 GPUs per node


def test_published_table_shows_the_planner_and_the_published_mfu():
    table = plan.published_table()
    for name, (sizes, mfu) in plan.PUBLISHED.items():
        model, cluster, batch = plan.PRESETS[name]
        theirs = plan.evaluate(model, cluster, global_batch=batch, recompute="full", **sizes)
        assert f"| {model.name} | {theirs.label} | yes | {theirs.mfu:.0%} |" in table
        assert mfu in table and "arXiv:" in mfu
        assert theirs.mfu <= cluster.achievable
    assert "52%" in table and "38-43%" in table


def test_plans_table_rows():
    p = seed70(dp=4, tp=8, strategy="zero1", recompute="full")
    row = plan.plans_table([p]).splitlines()[2]
    assert row.startswith(f"| {p.label} | 1 | yes | {p.memory_total / 1e9:.1f} |")
    assert row.endswith(f"| {p.step_s:.1f} | {p.mfu:.0%} |")


# --- DualPipe-V and Ulysses in the planner -----------------------------------------------------
# Derived here: with a step's busy time W (compute and exposed comms) over m micro-batches, a
# rank's chunk forward, input backward and weight backward each cost W/(6m) and a pair
# F&B = W/(2m), so DualPipe's (p - 1)(F&B + B - 3W) is (p - 1) W/(3m): a bubble share of
# (p - 1)/(3m + p - 1), against 1F1B's (p - 1)/(m + p - 1). Activations: 2p + 1 chunks of
# half a stage, p + 1/2 micro-batches of a stage, against 1F1B's min(p, m) = p. Its pairs hide the
# share (2m - 2p - 1)/(2m) of the EP time (the last rank's pairs), up to the compute.
# Ulysses: 8 all-to-alls of (c - 1)/c of a rank's b s/c (2 h_q + 2 h_kv) bf16 features per
# layer, forward and backward, and c must divide both head counts of a TP rank.

def _deepseek(schedule, batch=15360):
    return plan.evaluate(plan.DEEPSEEK_V3, plan.DEEPSEEK_CLUSTER, dp=2, pp=16, ep=64,
                         global_batch=batch, recompute="full", schedule=schedule)


def test_dualpipe_v_bubble_memory_and_overlap_in_the_plan():
    base, dpv = _deepseek("1f1b"), _deepseek("dualpipe_v")
    p, m = 16, 15360 // (2 * 64)
    assert base.kept and dpv.kept and m == 120
    assert base.bubble == pytest.approx((p - 1) / (m + p - 1))
    assert dpv.bubble == pytest.approx((p - 1) / (3 * m + p - 1))
    # full recomputation keeps each layer's bf16 input, 2 b s h, for the micro-batches held:
    # half a micro-batch more of the stage's 4 layers
    layer_input = 2 * 1 * 4096 * 7168
    assert dpv.memory["activations"] - base.memory["activations"] == pytest.approx(
        0.5 * math.ceil(61 / p) * layer_input)
    # one copy of the layers' weights; rank 0 runs the first and the last stage of the V, so
    # it holds the output layer's V h beside the embedding's (2 + 2 + 12/128 bytes each, ZeRO-1
    # over dp·ep = 128) and one micro-batch's fp32 logits, 4 b s V (t = 1)
    assert (dpv.stage, base.stage) == ("first and last", "first")
    head = 129280 * 7168
    for part, per_param in (("weights", 2), ("gradients", 2), ("optimizer state", 12 / 128)):
        assert dpv.memory[part] - base.memory[part] == pytest.approx(per_param * head)
    assert (dpv.memory["logits"], base.memory["logits"]) == (4 * 4096 * 129280, 0.0)
    compute = base.times["compute useful"] + base.times["compute overhead"]
    hidden = (2 * m - 2 * p - 1) / (2 * m) * min(1.0, compute / base.times["EP comms"])
    assert dpv.times["EP comms"] == pytest.approx(base.times["EP comms"] * (1 - hidden))
    assert dpv.step_s < base.step_s and "DualPipe-V PP 16" in dpv.label
    assert "two chunks each" in " ".join(dpv.reasons)


def test_dualpipe_v_needs_two_micro_batches_per_rank():
    few = _deepseek("dualpipe_v", batch=1920)  # m = 15 < 2p = 32
    assert not few.kept and any("m >= 2p" in r for r in few.reasons)
    assert _deepseek("1f1b", batch=1920).kept


def test_plan_tries_the_schedules_it_is_given():
    default = plan.plan(plan.DEEPSEEK_V3, plan.DEEPSEEK_CLUSTER, global_batch=15360)
    assert {p.schedule for p in default} == {"1f1b"}  # unchanged unless asked
    both = plan.plan(plan.DEEPSEEK_V3, plan.DEEPSEEK_CLUSTER, global_batch=15360,
                     schedules=("1f1b", "dualpipe_v"))
    assert {p.schedule for p in both if p.pp > 1} == {"1f1b", "dualpipe_v"}
    assert plan.best(both).schedule == "dualpipe_v"  # the EP overlap changes the winner
    assert plan.best(both).step_s < plan.best(default).step_s
    with pytest.raises(ValueError, match="schedule"):
        _deepseek("zb_v")


def _llama_long(cp_kind, **model):
    m = dataclasses.replace(plan.LLAMA3_405B_LONG, **model)
    return plan.evaluate(m, plan.LLAMA3_CLUSTER, tp=8, cp=16, pp=16, dp=8, global_batch=128,
                         recompute="full", cp_kind=cp_kind)


def test_ulysses_caps_at_the_heads_of_a_tp_rank():
    ring, uly = _llama_long("ring"), _llama_long("ulysses")
    assert ring.kept and not uly.kept  # 8 KV heads under TP 8: one per rank, not 16
    assert any("caps at the head count" in r and "1 key/value heads" in r for r in uly.reasons)
    with pytest.raises(ValueError, match="cp_kind"):
        _llama_long("zigzag")


def test_ulysses_bytes_and_where_it_wins():
    # the same run with full multi-head attention (128 KV heads, 16 per TP rank): Ulysses is
    # allowed, and over RoCE the ring's 8192-token blocks cannot hide their K and V
    uly, ring = _llama_long("ulysses", kv_heads=0), _llama_long("ring", kv_heads=0)
    assert uly.kept and ring.kept
    b, s, c, m, layers = 1, 131072, 16, 16, math.ceil(126 / 16)
    features = 16 * 128  # 16 heads of 128 per TP rank, for q, k, v and the output alike
    per_layer = 2 * 4 * (c - 1) / c * b * s / c * features * 2  # bf16
    assert uly.axis("cp").nbytes == pytest.approx(m * layers * per_layer)
    assert uly.times["CP comms"] == pytest.approx(uly.axis("cp").seconds)  # nothing hidden
    assert uly.times["CP comms"] < ring.times["CP comms"] and uly.step_s < ring.step_s
    ranked = plan.plan(dataclasses.replace(plan.LLAMA3_405B_LONG, kv_heads=0),
                       plan.LLAMA3_CLUSTER, global_batch=128, cp_sizes=(1, 16),
                       cp_kinds=("ring", "ulysses"))
    assert plan.best(ranked).cp_kind == "ulysses" and "Ulysses CP 16" in plan.best(ranked).label
    gqa = plan.plan(plan.LLAMA3_405B_LONG, plan.LLAMA3_CLUSTER, global_batch=128,
                    cp_sizes=(1, 16), cp_kinds=("ring", "ulysses"))
    assert plan.best(gqa).cp_kind == "ring"  # the real model: 8 KV heads, the ring hides them


def test_variants_table_names_both_choices():
    table = plan.variants_table()
    assert "DualPipe-V PP 16" in table and "EP 64 × PP 16" in table
    assert "Ulysses CP 16" in table and "caps at the head count" in table
