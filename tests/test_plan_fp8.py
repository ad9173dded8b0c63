"""The planner's logits, FP8 and NVL72 options against closed forms worked out here by hand.

Derived here, not read from parlab:
- the loss keeps one micro-batch's fp32 logits on the stage that computes it: 4 b s V bytes,
  4 b s V / t per TP rank under a vocabulary-parallel cross-entropy;
- under FP8 a layer's GEMM inputs are kept in 1 byte: of Korthikanti's 34 sbh, the LayerNorm
  outputs feeding QKV and fc1 (4), the output projection's input (2) and fc2's input (8), so
  34 - (4 + 2 + 8)/2 = 27 sbh;
- TP + SP sends, per layer, 4 all-gathers and 4 reduce-scatters of a (b, s, h) tensor, each
  (t-1)/t of it: FP8 halves the all-gathers' bytes and leaves the reduce-scatters';
- ZeRO-3 gathers the weights twice and reduce-scatters the gradients once a pass: (2+2+2)
  (d-1)/d P bytes in bf16, (1+1+2) with FP8 all-gathers.
"""

from __future__ import annotations

import math

import pytest

from parlab import costs, plan
from parlab.plan import Cluster, Model

S, V = 8192, 128256
SMALL = Model("small, big vocabulary", 2e9, layers=8, hidden=1024, heads=16, seq=4096,
              vocab=32000)
CLUSTER = Cluster("16", gpus=16, gpus_per_node=8, memory=80e9, intra_bw=450e9, inter_bw=50e9,
                  flops=1e15)


def test_logits_bytes_by_hand():
    one = 4 * 1 * S * V  # fp32, b = 1
    assert costs.logits_bytes(1, S, V) == one
    assert one / 1e9 == pytest.approx(4.2, abs=0.01)  # "about 4 GB per micro-batch"
    assert costs.logits_bytes(2, S, V, 8) == 2 * one / 8  # each TP rank its V/t columns
    assert costs.logits_bytes(2, S, V, 8, vocab_parallel=False) == 2 * one  # gathered: all V
    with pytest.raises(ValueError, match="vocab"):
        costs.logits_bytes(1, S, 0)


def test_the_last_stage_holds_the_logits_and_may_be_the_fullest():
    b, s, h, t, L, m = 1, 4096, 1024, 2, 8, 16
    p = plan.evaluate(SMALL, CLUSTER, dp=2, tp=t, pp=4, global_batch=2 * m, recompute="full")
    layers = math.ceil(L / 4)
    layer_input, layer = 2 * b * s * h / t, 34 * b * s * h / t
    first = 4 * layers * layer_input + layer  # 1F1B: min(p, m) = 4 micro-batches in flight
    last = 1 * layers * layer_input + layer  # the last stage: one
    logits = 4 * b * s * 32000 / t
    assert logits + last > first  # the case this test is about
    assert p.stage == "last" and p.memory["logits"] == pytest.approx(logits)
    assert p.memory["activations"] == pytest.approx(last)
    assert "fp32 logits" in p.reasons[0] and "the last stage" in p.reasons[0]
    # selective recomputation keeps 34 s b h / t a layer: 4 micro-batches of it outweigh them
    q = plan.evaluate(SMALL, CLUSTER, dp=2, tp=t, pp=4, global_batch=2 * m)
    assert q.stage == "first" and q.memory["logits"] == 0
    assert q.memory["activations"] == pytest.approx(4 * layers * layer)
    # the first and the last stage hold the same parameters: L_s layers and one V h
    per_layer = (2e9 - 2 * 32000 * h) / L
    for one in (p, q):
        assert one.memory["weights"] == pytest.approx(2 * (layers * per_layer + 32000 * h) / t)


def test_without_a_pipeline_one_stage_holds_both_ends():
    p = plan.evaluate(SMALL, CLUSTER, dp=8, tp=2, global_batch=16, recompute="full")
    assert p.stage == "only" and "stage" not in p.reasons[0]
    assert p.memory["logits"] == pytest.approx(4 * 4096 * 32000 / 2)
    assert p.memory["weights"] == pytest.approx(2 * 2e9 / 2)  # every parameter, over t


def test_fp8_keeps_27_of_34_sbh_and_the_state_unchanged():
    b, s, h, a, t = 1, 4096, 1024, 16, 4
    assert costs.activation_bytes_per_layer(b, s, h, a, t, sp=True, keep_scores=False,
                                            precision="fp8") == pytest.approx(27 * s * b * h / t)
    assert costs.activation_bytes_per_layer(b, s, h, a, t, sp=True, keep_scores=False) == \
        pytest.approx(34 * s * b * h / t)
    scores = 5 * a * s * s * b / t  # the softmax stays bf16
    assert costs.activation_bytes_per_layer(b, s, h, a, t, sp=True, precision="fp8") == \
        pytest.approx(27 * s * b * h / t + scores)
    bf16 = plan.evaluate(SMALL, CLUSTER, dp=2, tp=2, pp=4, global_batch=32)
    fp8 = plan.evaluate(SMALL, CLUSTER, dp=2, tp=2, pp=4, global_batch=32, precision="fp8")
    assert fp8.memory["activations"] == pytest.approx(bf16.memory["activations"] * 27 / 34)
    for part in ("weights", "gradients", "optimizer state", "logits"):
        assert fp8.memory[part] == bf16.memory[part]  # bf16 weights, fp32 Adam, fp32 logits
    assert fp8.label == bf16.label + ", FP8" and fp8.precision == "fp8"


def test_fp8_halves_exactly_the_tp_all_gathers():
    b, s, h, t = 2, 4096, 8192, 8
    tensor = b * s * h  # elements of one (b, s, h) activation
    bf16 = costs.tp_bytes_by_collective(b, s, h, t)
    fp8 = costs.tp_bytes_by_collective(b, s, h, t, precision="fp8")
    # 6 all-gathers: 2 forward, the backward's 2 re-gathers of the LayerNorm outputs (the
    # saved FP8 shards) and its 2 gathers of the output gradient
    assert bf16["all-gather"] == 6 * (t - 1) / t * tensor * 2
    assert fp8["all-gather"] == bf16["all-gather"] / 2
    assert fp8["reduce-scatter"] == bf16["reduce-scatter"] == 4 * (t - 1) / t * tensor * 2
    assert sum(bf16.values()) == pytest.approx(20 * (t - 1) / t * tensor)
    assert sum(fp8.values()) == pytest.approx(14 * (t - 1) / t * tensor)
    # in the planner: TP's bytes go from 20 to 14 (t-1)/t bsh; PP's and DP's stay
    one = {"dp": 2, "tp": 2, "pp": 4, "global_batch": 32}
    p16, p8 = (plan.evaluate(SMALL, CLUSTER, **one, precision=x) for x in ("bf16", "fp8"))
    assert p8.axis("tp").nbytes == pytest.approx(p16.axis("tp").nbytes * 14 / 20)
    assert p8.axis("pp").nbytes == p16.axis("pp").nbytes
    assert p8.axis("dp").nbytes == p16.axis("dp").nbytes  # zero1: bf16 gradients and weights


def test_fp8_zero3_gathers_its_weights_in_one_byte():
    n, d = 1e9, 8
    bf16 = costs.fsdp_bytes_by_collective(n, d)
    fp8 = costs.fsdp_bytes_by_collective(n, d, precision="fp8")
    assert sum(bf16.values()) == pytest.approx(6 * (d - 1) / d * n)
    assert sum(bf16.values()) == pytest.approx(costs.dp_traffic_bytes(n, "zero3", d))
    assert sum(fp8.values()) == pytest.approx(4 * (d - 1) / d * n)
    one = {"dp": 8, "tp": 2, "global_batch": 32, "strategy": "zero3"}
    p16, p8 = (plan.evaluate(SMALL, CLUSTER, **one, precision=x) for x in ("bf16", "fp8"))
    assert p8.axis("dp").nbytes == pytest.approx(p16.axis("dp").nbytes * 4 / 6)
    assert p8.memory["gathered weights"] == pytest.approx(p16.memory["gathered weights"] / 2)
    with pytest.raises(ValueError, match="precision"):
        plan.evaluate(SMALL, CLUSTER, **one, precision="fp4")


# --- NVL72: NVLink domains of 72 (of which a run uses 64 for power-of-two groups) --------------

def test_nvl72_keeps_tp_16_inside_a_domain_where_h100_nodes_refuse_it():
    shape = {"dp": 4, "tp": 16, "pp": 8, "global_batch": 512}
    h100 = plan.evaluate(plan.LLAMA3_405B, plan.H100_512, **shape)
    racks = plan.evaluate(plan.LLAMA3_405B, plan.GB200_NVL72_512, **shape)
    cut = plan.evaluate(plan.LLAMA3_405B, plan.GB200_RACKS, **shape)
    assert not h100.kept and any(r.startswith("TP 16 spans 2 nodes") for r in h100.reasons)
    assert not cut.kept and cut.axis("tp").nodes == 2  # the same GPUs, NVLink cut at 8
    assert racks.kept and racks.axis("tp").intra_node and racks.axis("tp").bandwidth == 900e9
    # a pipeline of 8 stages of TP 16 is 128 GPUs: it spans two racks of 64
    assert racks.axis("pp").nodes == 2 and racks.axis("pp").link == "InfiniBand"
    # one whole rack of 72: TP 8 uses it all, TP 16 cannot (16 does not divide 72)
    rack = plan.evaluate(plan.LLAMA3_405B, plan.GB200_NVL72, dp=1, tp=8, pp=9, global_batch=72,
                         recompute="full")
    assert rack.axis("pp").intra_node and rack.axis("tp").intra_node
    with pytest.raises(ValueError, match="72 GPUs"):
        plan.evaluate(plan.LLAMA3_405B, plan.GB200_NVL72, dp=1, tp=16, pp=4, global_batch=72)


def test_nvl72_presets_quote_nvlink_5_per_direction():
    for cluster in (plan.GB200_NVL72, plan.GB200_NVL72_512):
        assert cluster.intra_bw == 1.8e12 / 2  # 1.8 TB/s counts both directions
        assert cluster.memory == pytest.approx(13.4e12 / 72, rel=0.01)
    assert plan.GB200_NVL72_512.gpus_per_node == 64 and plan.GB200_RACKS.gpus_per_node == 8
