"""parlab.costs against numbers derived by hand or by an independent simulation.

Every expected value is written out as arithmetic here (or produced by a small brute-force
model in this file), never copied from the function's own output.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import pytest

from parlab import costs

MiB = 2**20


# --- independent models: simulate the ring algorithms chunk by chunk -------------------------

def simulate_ring_allreduce(t: int, chunk_bytes: int) -> tuple[list[int], list[list[int]]]:
    """Run a real ring all-reduce on integer data; return bytes sent per rank and the result.

    Rank r holds values data[r][c] = (r + 1) * 10**c for chunk c. Reduce-scatter: at step k rank
    r sends chunk (r - k) mod t to r+1, which adds it in. All-gather: at step k rank r sends
    its completed chunk (r + 1 - k) mod t to r+1, which overwrites.
    """
    data = [[(r + 1) * 10**c for c in range(t)] for r in range(t)]
    sent = [0] * t
    for k in range(t - 1):  # reduce-scatter
        msgs = [(r, (r - k) % t, data[r][(r - k) % t]) for r in range(t)]
        for r, c, val in msgs:
            data[(r + 1) % t][c] += val
            sent[r] += chunk_bytes
    for k in range(t - 1):  # all-gather
        msgs = [(r, (r + 1 - k) % t, data[r][(r + 1 - k) % t]) for r in range(t)]
        for r, c, val in msgs:
            data[(r + 1) % t][c] = val
            sent[r] += chunk_bytes
    return sent, data


def simulate_ring_allgather(t: int, chunk_bytes: int) -> list[int]:
    have = [{r} for r in range(t)]
    sent = [0] * t
    for k in range(t - 1):
        for r in range(t):
            have[(r + 1) % t].add((r - k) % t)  # forward the chunk received last step
            sent[r] += chunk_bytes
    assert all(h == set(range(t)) for h in have)
    return sent


def simulate_chain_broadcast(t: int, n_chunks: int, chunk_bytes: int) -> list[int]:
    """Root 0 streams chunks down the chain 0 -> 1 -> ... -> t-1; each rank forwards each chunk."""
    sent = [0] * t
    received = [n_chunks] + [0] * (t - 1)
    for _ in range(n_chunks + t):  # enough ticks for the pipeline to drain
        for r in reversed(range(t - 1)):
            if received[r] > received[r + 1]:
                received[r + 1] += 1
                sent[r] += chunk_bytes
    assert received == [n_chunks] * t
    return sent


# --- collectives ------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 3, 4, 8])
def test_ring_allreduce_bytes_matches_simulation(t):
    chunk = 1000
    sent, data = simulate_ring_allreduce(t, chunk)
    total = sum(r + 1 for r in range(t))
    assert all(row == [total * 10**c for c in range(t)] for row in data)  # it really reduced
    assert costs.ring_allreduce_bytes(t * chunk, t) == pytest.approx(sent[0])
    assert len(set(sent)) == 1  # every rank sends the same


def test_ring_allreduce_bytes_formula_and_edges():
    assert costs.ring_allreduce_bytes(1024, 1) == 0
    assert costs.ring_allreduce_bytes(1024, 4) == pytest.approx(2 * 3 / 4 * 1024)
    assert costs.ring_allreduce_bytes(0, 4) == 0  # an empty tensor costs nothing
    assert costs.ring_allreduce_bytes(1000, 1000) == pytest.approx(2 * 999)  # -> 2n, not 0


@pytest.mark.parametrize("t", [1, 2, 5, 8])
def test_allgather_and_reduce_scatter_match_simulation(t):
    chunk = 64
    per_rank = simulate_ring_allgather(t, chunk)[0]
    assert costs.ring_allgather_bytes(t * chunk, t) == pytest.approx(per_rank)
    # A ring reduce-scatter is the first half of the all-reduce simulation.
    assert costs.ring_reduce_scatter_bytes(t * chunk, t) == pytest.approx((t - 1) * chunk)
    assert costs.ring_reduce_scatter_bytes(t * chunk, t) + costs.ring_allgather_bytes(
        t * chunk, t) == pytest.approx(simulate_ring_allreduce(t, chunk)[0][0])


@pytest.mark.parametrize("t", [1, 2, 4, 7])
def test_all_to_all_counts_chunks_that_leave(t):
    chunk = 10
    sent = sum(chunk for dst in range(t) if dst != 0)  # rank 0 keeps its own chunk
    assert costs.all_to_all_bytes(t * chunk, t) == pytest.approx(sent)


@pytest.mark.parametrize("t", [1, 2, 3, 6])
def test_broadcast_is_busiest_rank_of_chain(t):
    sent = simulate_chain_broadcast(t, n_chunks=8, chunk_bytes=16)
    assert costs.broadcast_bytes(8 * 16, t) == max(sent)


# --- time and the TP practice problem ---------------------------------------------------------

def test_alpha_beta_and_transfer_time():
    assert costs.transfer_time(3e9, 1.5e9) == pytest.approx(2.0)
    assert costs.alpha_beta_time(1e6, alpha=5e-6, bandwidth=1e9) == pytest.approx(5e-6 + 1e-3)
    # 4 ranks: 2*3 = 6 latency steps, 2*3/4 * 4e6 = 6e6 bytes at 1e9 B/s
    assert costs.ring_allreduce_time(4e6, 4, alpha=1e-5, bandwidth=1e9) == pytest.approx(
        6 * 1e-5 + 6e6 / 1e9)
    assert costs.ring_allreduce_time(4e6, 1, alpha=1e-5, bandwidth=1e9) == 0


def test_tp_practice_problem_seed_003():
    # b=1, s=h=8192, bf16, t=8: one all-reduce moves 2*7/8 of a 2*8192*8192-byte tensor.
    one = 2 * 7 / 8 * 2 * 8192 * 8192
    assert one == 234_881_024 and one / MiB == 224
    assert costs.ring_allreduce_bytes(2 * 8192 * 8192, 8) == pytest.approx(one)
    layer = costs.tp_bytes_per_layer(1, 8192, 8192, 8)
    assert layer == pytest.approx(4 * one)
    assert layer / MiB == pytest.approx(896)
    assert layer == pytest.approx(16 * 7 / 8 * 1 * 8192 * 8192)
    assert costs.transfer_time(layer, 900e9) == pytest.approx(1.0e-3, rel=0.05)   # ~1 ms
    assert costs.transfer_time(layer, 50e9) == pytest.approx(18.8e-3, rel=0.01)   # ~18-19 ms
    # fp32 activations double it; t=1 sends nothing
    assert costs.tp_bytes_per_layer(1, 8192, 8192, 8, dtype_bytes=4) == pytest.approx(2 * layer)
    assert costs.tp_bytes_per_layer(2, 16, 32, 1) == 0


# --- memory and DP traffic --------------------------------------------------------------------

def test_state_bytes_breakdown():
    assert sum(costs.STATE_BYTES_PER_PARAM.values()) == 2 + 2 + 4 + 4 + 4  # bf16 w, g; fp32 x3


def test_training_state_70b_practice_problem():
    p = 70e9
    assert costs.training_state_bytes(p) == pytest.approx(70e9 * 16)       # 1120 GB
    assert costs.training_state_bytes(p, "ddp", dp=32) == pytest.approx(1120e9)
    assert costs.training_state_bytes(p, "zero3", dp=32) == pytest.approx(1120e9 / 32)  # 35 GB
    assert costs.training_state_bytes(p, "fsdp", dp=32) == pytest.approx(35e9)


@pytest.mark.parametrize("strategy,per_param", [
    ("ddp", 2 + 2 + 12),
    ("zero1", 2 + 2 + 12 / 4),
    ("zero2", 2 + (2 + 12) / 4),
    ("zero3", 16 / 4),
    ("fsdp", 16 / 4),
])
def test_training_state_each_strategy(strategy, per_param):
    assert costs.training_state_bytes(1000, strategy, dp=4) == pytest.approx(1000 * per_param)
    assert costs.training_state_bytes(1000, strategy, dp=1) == pytest.approx(1000 * 16)


@pytest.mark.parametrize("strategy,passes", [
    ("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 3), ("fsdp", 3)])
def test_dp_traffic(strategy, passes):
    grad_bytes = 1e9 * 2  # P = 1e9 bf16 gradients
    assert costs.dp_traffic_bytes(1e9, strategy, 8) == pytest.approx(passes * 7 / 8 * grad_bytes)
    assert costs.dp_traffic_bytes(1e9, strategy, 1) == 0
    assert costs.dp_traffic_bytes(1e9, strategy, 8, dtype_bytes=4) == pytest.approx(
        passes * 7 / 8 * 4e9)


def test_dp_traffic_fsdp_ratio_and_keep_params():
    ddp = costs.dp_traffic_bytes(1e9, "ddp", 16)
    assert costs.dp_traffic_bytes(1e9, "fsdp", 16) / ddp == pytest.approx(1.5)  # seed: 3P vs 2P
    assert costs.dp_traffic_bytes(1e9, "fsdp", 16, reshard_after_forward=False) == ddp


# --- pipeline bubble ------------------------------------------------------------------------

def test_bubble_fraction_and_ratio():
    assert costs.bubble_fraction(8, 16) == pytest.approx(7 / 23)   # seed 003: ~30%
    assert costs.bubble_fraction(16, 32) == pytest.approx(15 / 47)
    assert costs.bubble_fraction(1, 5) == 0
    assert costs.bubble_fraction(4, 6, v=2) == pytest.approx(3 / (12 + 3))
    assert costs.bubble_ratio(8, 16) == pytest.approx(7 / 16)
    assert costs.bubble_ratio(4, 6, v=2) == pytest.approx(3 / 12)
    assert costs.bubble_ratio(8, 2) > 1  # a ratio, not a share


def brute_min_m(p, x, v=1, ratio=False):
    x, m = Fraction(x), 1
    while Fraction(p - 1, v * m) > x if ratio else Fraction(p - 1, v * m + p - 1) > x:
        m += 1
    return m


def test_min_microbatches_seed_numbers():
    assert costs.min_microbatches(8, 0.15) == 40      # 7/(m+7) <= 0.15 -> m >= 39.67
    assert 7 / (40 + 7) <= 0.15 < 7 / (39 + 7)
    assert costs.min_microbatches(8, 0.15, v=2, form="ratio") == 24  # seed's (1/2)(7/m) <= 0.15
    assert costs.min_microbatches(8, 0.15, v=2) == 20  # exact share: 7/(2m+7) <= 0.15
    assert costs.min_microbatches(1, 0.01) == 1


@pytest.mark.parametrize("p,pct,v", [(4, 20, 1), (4, 20, 2), (4, 20, 4), (4, 3, 1),
                                     (4, 12, 1), (7, 3, 2), (5, 20, 1), (2, 50, 1)])
def test_min_microbatches_exact_boundaries(p, pct, v):
    # Cases where m lands exactly on the bound: naive float ceil((p-1)(1-x)/(vx)) overshoots.
    m = costs.min_microbatches(p, pct / 100, v)
    assert m == brute_min_m(p, Fraction(pct, 100), v)
    assert costs.bubble_fraction(p, m, v) <= pct / 100 + 1e-12
    if m > 1:
        assert Fraction(p - 1, v * (m - 1) + p - 1) > Fraction(pct, 100)


def test_min_microbatches_matches_brute_force_grid():
    for p in (2, 3, 4, 8, 16):
        for pct in range(1, 100, 7):
            for v in (1, 2, 3):
                x = Fraction(pct, 100)
                assert costs.min_microbatches(p, pct / 100, v) == brute_min_m(p, x, v)
                assert costs.min_microbatches(p, x, v, form="ratio") == brute_min_m(
                    p, x, v, ratio=True)


# --- FLOPs per byte (seed 000) ------------------------------------------------------------------

def test_interconnect_argument_seed_000():
    assert costs.tp_flops_per_byte(8192) == 8192
    need_nvlink = costs.required_flops_per_byte(1e15, 900e9)
    assert need_nvlink == pytest.approx(1e15 / 9e11) and round(need_nvlink) == 1111
    assert costs.headroom(8192, 1e15, 900e9) == pytest.approx(8192 / (1e15 / 9e11))
    assert round(costs.headroom(8192, 1e15, 900e9), 1) == 7.4
    assert costs.required_flops_per_byte(1e15, 50e9) == pytest.approx(20_000)
    assert 1 / costs.headroom(8192, 1e15, 50e9) == pytest.approx(20_000 / 8192)  # ~2.4x short
    dp = costs.dp_flops_per_byte(4e6)
    assert dp == pytest.approx(6 * 4e6 / 2) and dp == pytest.approx(1.2e7)
    assert costs.headroom(dp, 1e15, 50e9) == pytest.approx(1.2e7 / 2e4)  # 600x


def test_tp_layer_flops_per_byte_keeps_constants():
    # fwd + bwd per rank 3 * 24 b s h^2 / t FLOPs; sent 4 * 2(t-1)/t * b s h * 2 bytes; b=s=1.
    h, t = 8192, 8
    assert costs.tp_layer_flops_per_byte(h, t) == pytest.approx(
        (3 * 24 * h * h / t) / (4 * 2 * (t - 1) / t * h * 2))
    assert costs.tp_layer_flops_per_byte(h, t) == pytest.approx(4.5 * h / 7)
    per_layer_bytes = costs.tp_bytes_per_layer(1, 1, h, t)  # the two must agree
    assert costs.tp_layer_flops_per_byte(h, t) == pytest.approx(72 * h * h / t / per_layer_bytes)


def test_comm_verdict_text():
    assert costs.comm_verdict(8192, 1e15, 900e9) == "compute-bound with 7.4x headroom"
    assert costs.comm_verdict(1.2e7, 1e15, 50e9) == "compute-bound with 600x headroom"
    short = costs.comm_verdict(8192, 1e15, 50e9)
    assert short.startswith("comm-bound: short by 2.4x")
    assert "41%" in short           # 8192 / 20000 = 0.41 with full overlap
    assert "29%" in short           # 0.41 / 1.41 with none
    assert costs.comm_verdict(1000, 1e15, 1e12).startswith("compute-bound with 1.0x")


def test_constants():
    # NVIDIA's datasheets print the bf16 Tensor Core rate with 2:4 sparsity, twice the dense one
    assert costs.H100_BF16_FLOPS == pytest.approx(1978.8e12 / 2)  # Hopper whitepaper: 1978.9
    assert costs.A100_BF16_FLOPS == 624e12 / 2
    assert costs.GB200_BF16_FLOPS == 360e15 / 72 / 2  # NVL72: 360 PFLOPS for 72 GPUs
    assert costs.HGX_B200_BF16_FLOPS == 36e15 / 8 / 2  # HGX B200: 36 PFLOPS for 8 GPUs
    assert costs.GB200_MEMORY_BYTES == pytest.approx(13.4e12 / 72, rel=1e-3)  # 13.4 TB / 72
    assert costs.HGX_B200_MEMORY_BYTES == 1440e9 / 8
    assert costs.NVLINK_BIDIR_BYTES_PER_S == 2 * costs.NVLINK_PER_DIRECTION_BYTES_PER_S == 900e9
    assert costs.NIC_400G_BYTES_PER_S == 400e9 / 8
    assert costs.ETHERNET_100G_BYTES_PER_S == 100e9 / 8


CARD_LITERALS = re.compile(r"flops\s*=\s*(1e15|989e12|989\.4e12|312e12|2\.5e15|2\.25e15)\b"
                           r"|memory\s*=\s*(186e9|180e9|192e9)\b")


def test_one_constant_per_card():
    """A card's FLOP/s and memory are typed once, in parlab.costs.hardware; lib/ and the
    notebooks read them from there (issue 44: 1e15 in one place, 989e12 in another)."""
    root = Path(__file__).resolve().parents[1]
    files = [p for p in (root / "lib" / "parlab").rglob("*.py") if p.name != "hardware.py"]
    files += sorted((root / "solutions").glob("*/*.ipynb"))
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in files
             for m in CARD_LITERALS.finditer(p.read_text())]
    assert not found, "card figures typed outside parlab.costs.hardware:\n" + "\n".join(found)


def test_state_bytes_per_param_by_recipe():
    # ZeRO's count: bf16 weights and grads, fp32 master, m, v; Megatron --bf16: fp32 main_grad;
    # torchtitan FSDP2: fp32 sharded weights (the master) and fp32 reduced grads; DeepSeek-V3:
    # fp32 master and grads, bf16 moments
    assert costs.state_bytes_per_param() == 2 + 2 + 4 + 4 + 4 == sum(
        costs.STATE_BYTES_PER_PARAM.values())
    assert costs.state_bytes_per_param("megatron") == 2 + 4 + 4 + 4 + 4 == 18
    assert costs.state_bytes_per_param("torchtitan") == 4 + 4 + 4 + 4
    assert costs.state_bytes_per_param("deepseek_v3") == 4 + 4 + 2 + 2
    with pytest.raises(ValueError, match="recipe"):
        costs.state_bytes_per_param("apex")


def test_sp_bytes_with_and_without_the_backward_regather():
    """Korthikanti et al. 4.2.2: only the sequence shard of the LayerNorm output is kept and it
    is all-gathered again in backward. Counted by hand per layer: forward 2 all-gathers + 2
    reduce-scatters; backward 2 re-gathers, 2 all-gathers of the output gradient, 2
    reduce-scatters of the input gradient. Each moves (t-1)/t of a (b, s, h) tensor."""
    b, s, h, t = 2, 1024, 4096, 8
    one = (t - 1) / t * b * s * h  # elements one ring all-gather or reduce-scatter sends
    bf16 = costs.tp_bytes_by_collective(b, s, h, t)
    assert bf16 == {"all-gather": 6 * one * 2, "reduce-scatter": 4 * one * 2}
    assert sum(bf16.values()) == pytest.approx(20 * one)  # 20 (t-1)/t bsh bytes
    kept = costs.tp_bytes_by_collective(b, s, h, t, regather=False)
    assert sum(kept.values()) == pytest.approx(costs.tp_bytes_per_layer(b, s, h, t))  # 16
    fp8 = costs.tp_bytes_by_collective(b, s, h, t, precision="fp8")
    assert fp8 == {"all-gather": 6 * one * 1, "reduce-scatter": 4 * one * 2}  # 14 (t-1)/t bsh
    # the memory side: the re-gather keeps 4 sbh of LayerNorm outputs as 4 sbh / t; kept
    # gathered, they stay whole: 4 (t-1)/t sbh more, exactly the bytes the two re-gathers send
    sp = costs.activation_bytes_per_layer(b, s, h, 32, t, sp=True, keep_scores=False)
    whole = costs.activation_bytes_per_layer(b, s, h, 32, t, sp=True, keep_scores=False,
                                             regather=False)
    assert sp == pytest.approx(34 * s * b * h / t)
    assert whole == pytest.approx(s * b * h * (4 + 30 / t))
    assert whole - sp == pytest.approx(sum(bf16.values()) - sum(kept.values()))


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("call,name", [
    (lambda: costs.ring_allreduce_bytes(1024, 0), "t"),
    (lambda: costs.ring_allreduce_bytes(-1, 2), "nbytes"),
    (lambda: costs.ring_allgather_bytes(1024, 2.5), "t"),
    (lambda: costs.ring_reduce_scatter_bytes(math.nan, 2), "nbytes"),
    (lambda: costs.all_to_all_bytes(1024, -3), "t"),
    (lambda: costs.broadcast_bytes("1024", 2), "nbytes"),
    (lambda: costs.transfer_time(1024, 0), "bandwidth"),
    (lambda: costs.alpha_beta_time(1024, alpha=-1, bandwidth=1e9), "alpha"),
    (lambda: costs.ring_allreduce_time(1024, 0, alpha=0, bandwidth=1e9), "t"),
    (lambda: costs.tp_bytes_per_layer(0, 8, 8, 2), "b"),
    (lambda: costs.tp_bytes_per_layer(1, 8, 8, 2, dtype_bytes=0), "dtype_bytes"),
    (lambda: costs.training_state_bytes(0), "n_params"),
    (lambda: costs.training_state_bytes(1e9, "zero3", dp=0), "dp"),
    (lambda: costs.dp_traffic_bytes(1e9, "ddp", 0), "dp"),
    (lambda: costs.bubble_fraction(0, 4), "p"),
    (lambda: costs.bubble_ratio(4, 0), "m"),
    (lambda: costs.bubble_fraction(4, 4, v=0), "v"),
    (lambda: costs.min_microbatches(8, 0), "max_bubble"),
    (lambda: costs.min_microbatches(8, 1.5), "max_bubble"),
    (lambda: costs.min_microbatches(8, 0.1, form="share"), "form"),
    (lambda: costs.tp_flops_per_byte(0), "h"),
    (lambda: costs.tp_layer_flops_per_byte(8192, 1), "t"),
    (lambda: costs.dp_flops_per_byte(-5), "n_tokens"),
    (lambda: costs.required_flops_per_byte(1e15, 0), "bytes_per_s"),
    (lambda: costs.headroom(10, 0, 1e9), "flops_per_s"),
    (lambda: costs.comm_verdict(0, 1e15, 1e9), "intensity"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()


@pytest.mark.parametrize("fn", [costs.training_state_bytes,
                                lambda p, s: costs.dp_traffic_bytes(p, s, 4)])
def test_unknown_strategy_lists_valid_ones(fn):
    with pytest.raises(ValueError, match="ddp, zero1, zero2, zero3, fsdp") as info:
        fn(1e9, "zero4")
    assert "zero4" in str(info.value)
