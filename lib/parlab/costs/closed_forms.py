r"""Closed-form cost models: bytes on the wire, time, memory, pipeline bubble, FLOPs per byte.

Every function is pure and cheap; notebooks, widgets and tests all call these, so a worked
number in the course is computed here, never typed by hand. Units: bytes, seconds, FLOPs,
bytes/s, FLOP/s (SI: 1 GB/s = 1e9 B/s). "Sent" means bytes one rank puts on its links.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Literal

# --- links (the cards' FLOP/s and memory: parlab.costs.hardware) -----------------------------

NVLINK_BIDIR_BYTES_PER_S = 900e9
"""H100 NVLink 4: 18 links x 50 GB/s = 900 GB/s, counting BOTH directions (NVIDIA's H100 datasheet).
The figure is often quoted as if it were one direction; the course shows both numbers."""
NVLINK_PER_DIRECTION_BYTES_PER_S = 450e9
"""The same NVLink, one direction: what a ring step actually sends at."""
NIC_400G_BYTES_PER_S = 50e9
"""One 400 Gb/s NIC (NDR InfiniBand / 400G Ethernet): 400e9 / 8 = 50 GB/s per direction."""
ETHERNET_100G_BYTES_PER_S = 12.5e9
"""One 100 Gb/s Ethernet port: 100e9 / 8 = 12.5 GB/s per direction."""

STATE_BYTES_PER_PARAM = {"weights": 2, "grads": 2, "optimizer": 12}
"""Mixed-precision Adam as the ZeRO paper counts it (Rajbhandari et al. 2020, arXiv:1910.02054):
bf16 weights + bf16 grads + fp32 (master copy, m, v) = 16 B/param, the course's convention.
Megatron-LM, torchtitan and DeepSeek-V3 keep other precisions: `precision.state_bytes_per_param`."""

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
_SHARDED = {  # which parts of STATE_BYTES_PER_PARAM each strategy splits over dp ranks
    "ddp": (),
    "zero1": ("optimizer",),
    "zero2": ("optimizer", "grads"),
    "zero3": ("optimizer", "grads", "weights"),
    "fsdp": ("optimizer", "grads", "weights"),
}


# --- input checks ---------------------------------------------------------------------------

_HINTS = {
    "nbytes": "the tensor size in bytes, e.g. x.numel() * x.element_size()",
    "n_params": "the parameter count, e.g. 70e9",
    "bandwidth": "link bandwidth in bytes/s, e.g. 50e9 for 50 GB/s",
    "bytes_per_s": "link bandwidth in bytes/s, e.g. 50e9 for 50 GB/s",
    "flops_per_s": "device throughput in FLOP/s, e.g. 989.4e12 (an H100)",
    "alpha": "per-message latency in seconds, e.g. 5e-6",
    "t": "the number of ranks in the group",
    "dp": "the data-parallel degree (ranks sharing the state)",
    "p": "the number of pipeline stages",
    "m": "the number of microbatches",
    "v": "model chunks per rank (1 unless interleaved)",
    "b": "the micro-batch size", "s": "the sequence length", "h": "the hidden size",
    "dtype_bytes": "bytes per element (2 for bf16, 4 for fp32)",
    "n_tokens": "tokens per step (per replica)", "intensity": "FLOPs per byte moved",
}


def _bad(name: str, value: object, need: str) -> ValueError:
    hint = _HINTS.get(name, "a size of the model or batch")
    return ValueError(f"{name} must be {need}, got {value!r}; pass {hint}")


def _size(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise _bad(name, value, "a finite number " + (">= 0" if allow_zero else "> 0"))
    return value


def _count(name: str, value: int, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise _bad(name, value, f"a whole number >= {minimum}")
    return int(value)


# --- collectives: bytes each rank sends -----------------------------------------------------

def ring_allreduce_bytes(nbytes: float, t: int) -> float:
    r"""Bytes each rank sends in a ring all-reduce of an n-byte tensor over t ranks.

    Reduce-scatter then all-gather, each t-1 steps of one n/t chunk:
    $2(t-1)\cdot\frac{n}{t} = 2\frac{t-1}{t}n$ (0 when t = 1). Tends to 2n, not to 0, as t grows.
    """
    n, t = _size("nbytes", nbytes, allow_zero=True), _count("t", t)
    return 2 * (t - 1) * n / t


def ring_allgather_bytes(nbytes: float, t: int) -> float:
    r"""Per-rank bytes sent by a ring all-gather; n is the gathered OUTPUT: $\frac{t-1}{t}n$."""
    n, t = _size("nbytes", nbytes, allow_zero=True), _count("t", t)
    return (t - 1) * n / t


def ring_reduce_scatter_bytes(nbytes: float, t: int) -> float:
    r"""Per-rank bytes sent by a ring reduce-scatter of an n-byte INPUT: $\frac{t-1}{t}n$."""
    n, t = _size("nbytes", nbytes, allow_zero=True), _count("t", t)
    return (t - 1) * n / t


def all_to_all_bytes(nbytes: float, t: int) -> float:
    r"""Per-rank bytes sent by an all-to-all; n is a rank's whole input, in t equal chunks.

    One chunk stays home, t-1 go out: $\frac{t-1}{t}n$.
    """
    n, t = _size("nbytes", nbytes, allow_zero=True), _count("t", t)
    return (t - 1) * n / t


def broadcast_bytes(nbytes: float, t: int) -> float:
    r"""Bytes sent by the busiest rank of a pipelined chain broadcast: n for t > 1, else 0.

    The root streams n bytes in chunks to rank 1, which forwards them to rank 2, and so on;
    every rank but the last sends n once. (A binomial tree would make the root send
    $\lceil\log_2 t\rceil n$.)
    """
    n, t = _size("nbytes", nbytes, allow_zero=True), _count("t", t)
    return n if t > 1 else 0.0


# --- time -----------------------------------------------------------------------------------

def transfer_time(nbytes: float, bandwidth: float) -> float:
    r"""Seconds to push n bytes through a link of the given bytes/s: $n / \beta$."""
    return _size("nbytes", nbytes, allow_zero=True) / _size("bandwidth", bandwidth)


def alpha_beta_time(nbytes: float, *, alpha: float, bandwidth: float) -> float:
    r"""One message in the alpha-beta model: $\alpha + n/\beta$ (alpha = latency in s)."""
    return _size("alpha", alpha, allow_zero=True) + transfer_time(nbytes, bandwidth)


def ring_allreduce_time(nbytes: float, t: int, *, alpha: float, bandwidth: float) -> float:
    r"""Ring all-reduce in the alpha-beta model: $2(t-1)\alpha + 2\frac{t-1}{t}\frac{n}{\beta}$.

    2(t-1) sequential steps, each paying the latency once and sending one n/t chunk.
    """
    steps = 2 * (_count("t", t) - 1)
    return steps * _size("alpha", alpha, allow_zero=True) + transfer_time(
        ring_allreduce_bytes(nbytes, t), bandwidth)


def tp_bytes_per_layer(b: int, s: int, h: int, t: int, dtype_bytes: int = 2) -> float:
    r"""Bytes each rank sends per transformer layer under Megatron tensor parallelism.

    Four all-reduces of the $b\cdot s\cdot h$ activation (2 forward: after attention and after
    the MLP; 2 backward: their conjugates), each a ring all-reduce:
    $V = 4 \cdot 2\frac{t-1}{t}\, bsh \cdot d = 16\frac{t-1}{t}bsh$ bytes for bf16 (d = 2).
    """
    elems = _count("b", b) * _count("s", s) * _count("h", h)
    return 4 * ring_allreduce_bytes(elems * _count("dtype_bytes", dtype_bytes), t)


def ulysses_bytes_per_layer(b: int, s: int, h: int, c: int, dtype_bytes: int = 2, *,
                            h_kv: int | None = None, backward: bool = False) -> float:
    r"""Bytes each rank sends per layer for Ulysses attention over c ranks (Jacobs et al.,
    DeepSpeed-Ulysses, arXiv:2309.14509; `parlab.cp.ulysses`).

    A rank holds s/c tokens, so q is $b\frac{s}{c}h$ elements ($h$ = heads × head size). An
    all-to-all keeps the 1/c of it that belongs to this rank's own heads and sends the rest:
    `all_to_all_bytes`, $\frac{c-1}{c}\,b\frac{s}{c}h\,d$. The forward runs four, q, k and v
    to head shards and the output back: $V = 4\frac{c-1}{c}\frac{bsh}{c}d$. With
    grouped-query attention k and v carry h_kv features: $\frac{c-1}{c}\frac{bs}{c}(2h +
    2h_{kv})d$. backward=True adds the backward's four (the output's gradient in, dq, dk, dv
    out), the same bytes again. Per link this is DeepSpeed's $4Nh/P$ for $P = c \gg 1$.
    """
    c, kv = _count("c", c), _count("h_kv", h if h_kv is None else h_kv)
    per_token = (2 * _count("h", h) + 2 * kv) * _count("dtype_bytes", dtype_bytes)
    rank = _count("b", b) * _count("s", s) / c * per_token  # this rank's q, k, v, out
    return all_to_all_bytes(rank, c) * (2 if backward else 1)


# --- memory and data-parallel traffic -------------------------------------------------------

def _strategy(strategy: str) -> str:
    if strategy not in _SHARDED:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    return strategy


def training_state_bytes(n_params: float, strategy: str = "ddp", dp: int = 1) -> float:
    r"""Per-device bytes of weights + grads + Adam state (no activations), P params, dp ranks.

    With $W=2, G=2, O=12$ bytes/param (STATE_BYTES_PER_PARAM):
    ddp $16P$; zero1 $(W+G)P + OP/d$; zero2 $WP + (G+O)P/d$; zero3 = fsdp $16P/d$.
    """
    p, d, sharded = _size("n_params", n_params), _count("dp", dp), _SHARDED[_strategy(strategy)]
    return sum(per * p / (d if part in sharded else 1)
               for part, per in STATE_BYTES_PER_PARAM.items())


def dp_traffic_bytes(n_params: float, strategy: str, dp: int, *, dtype_bytes: int = 2,
                     reshard_after_forward: bool = True) -> float:
    r"""Per-rank bytes sent per optimizer step by data parallelism; G = P * dtype_bytes.

    ddp, zero1, zero2: one ring all-reduce of the grads (ZeRO-1/2 do it as reduce-scatter +
    all-gather of the updated params, same bytes): $2\frac{d-1}{d}G$.
    zero3, fsdp: all-gather params for forward, again for backward, reduce-scatter grads:
    $3\frac{d-1}{d}G$ (2 if fsdp keeps params after forward, reshard_after_forward=False).
    The rule of thumb "2P vs 3P" (ZeRO, arXiv:1910.02054) is this with $\frac{d-1}{d} \to 1$
    and G counted in elements.
    """
    g = _size("n_params", n_params) * _count("dtype_bytes", dtype_bytes)
    d, strategy = _count("dp", dp), _strategy(strategy)
    passes = 2 if strategy in ("ddp", "zero1", "zero2") else 3
    if strategy == "fsdp" and not reshard_after_forward:
        passes = 2
    return passes * ring_allgather_bytes(g, d)


# --- pipeline bubble ------------------------------------------------------------------------

def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    r"""Share of the step a pipeline stage idles: $\frac{p-1}{vm + p-1}$ (GPipe's accounting).

    Fill + drain cost (p-1)/v microbatch-times against m of useful work (v = chunks per rank),
    as a share of the whole step: GPipe (Huang et al., arXiv:1811.06965) counts the bubble this
    way. Megatron's "bubble time fraction" (Narayanan et al., arXiv:2104.04473) is the ratio to
    the ideal time instead, `bubble_ratio`: $\frac{p-1}{vm}$.
    """
    p, m, v = _count("p", p), _count("m", m), _count("v", v)
    return (p - 1) / (v * m + p - 1)


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    r"""Bubble as a ratio to the useful time: $\frac{p-1}{vm}$ (can exceed 1).

    Megatron's bubble time fraction (Narayanan et al., arXiv:2104.04473, section 2.2): the
    bubble time divided by the ideal (bubble-free) step time.
    """
    p, m, v = _count("p", p), _count("m", m), _count("v", v)
    return (p - 1) / (v * m)


def min_microbatches(p: int, max_bubble: float, v: int = 1, *,
                     form: Literal["fraction", "ratio"] = "fraction") -> int:
    r"""Smallest m with bubble_fraction(p, m, v) <= max_bubble (or bubble_ratio, form="ratio").

    Fraction: $m \ge \frac{(p-1)(1-x)}{vx}$; ratio: $m \ge \frac{p-1}{vx}$. Computed in exact
    rationals, with max_bubble read as the decimal it was written as (0.15 is 3/20), so exact
    boundaries such as p=4, x=0.2 -> m=12 (3/15 = 0.2) are not pushed up by rounding.
    """
    p, v = _count("p", p), _count("v", v)
    if isinstance(max_bubble, bool) or not isinstance(max_bubble, numbers.Real) \
            or not 0 < max_bubble < 1:
        raise ValueError(f"max_bubble must be a share strictly between 0 and 1 (0.15 for 15%), "
                         f"got {max_bubble!r}")
    x = max_bubble if isinstance(max_bubble, Fraction) else Fraction(repr(float(max_bubble)))
    if form == "fraction":
        bound = (p - 1) * (1 - x) / (v * x)
    elif form == "ratio":
        bound = (p - 1) / (v * x)
    else:
        raise ValueError(f"form must be 'fraction' or 'ratio', got {form!r}")
    return max(1, math.ceil(bound))


# --- FLOPs per byte: is a strategy compute-bound on a link? (module 00) ------------------------

def tp_flops_per_byte(h: float) -> float:
    r"""Tensor parallelism's FLOPs per byte communicated, to order of magnitude: $\approx H$.

    The GEMMs do $O(BSH^2)$ FLOPs, the all-reduces move $O(BSH)$ bytes, so with every constant
    dropped the ratio is $BSH^2/BSH = H$: a model constant, unchanged by batch size.
    tp_layer_flops_per_byte keeps the constants.
    """
    return float(_size("h", h))


def tp_layer_flops_per_byte(h: int, t: int, *, dtype_bytes: int = 2) -> float:
    r"""Per-rank FLOPs per byte sent for a TP layer, constants kept: $\frac{9H}{(t-1)d}$.

    Forward per rank: $24bsh^2/t$ FLOPs (QKV + out-proj 8, MLP 16; attention scores ignored),
    backward twice that: $72bsh^2/t$ in all. Sent: the four ring all-reduces of
    `tp_bytes_per_layer` (g twice in forward, f twice in backward), $4 \cdot 2\frac{t-1}{t}
    bsh\,d$ bytes. For bf16 this is $4.5H/(t-1)$: 0.64 H at t = 8, so the rule of thumb "≈ H" is
    optimistic by about 1.6x.
    """
    h, t, d = _count("h", h), _count("t", t, minimum=2), _count("dtype_bytes", dtype_bytes)
    return 9 * h / ((t - 1) * d)


def dp_flops_per_byte(n_tokens: float) -> float:
    r"""Data parallelism's FLOPs per byte, rule-of-thumb form: $\frac{6PN_{tok}}{2P} = 3N_{tok}$.

    6P FLOPs per token (forward + backward) against an all-reduce counted as 2P (the ring's
    factor 2 times P gradients; in bf16 bytes it is 4P, giving $1.5N_{tok}$). P cancels: only
    tokens per step matter. Against one device's FLOP/s, N_tok means tokens per replica.
    """
    return 3.0 * _size("n_tokens", n_tokens)


def required_flops_per_byte(flops_per_s: float, bytes_per_s: float) -> float:
    r"""FLOPs per byte a device must do to hide its link: $\frac{\text{FLOP/s}}{\text{bytes/s}}$."""
    return _size("flops_per_s", flops_per_s) / _size("bytes_per_s", bytes_per_s)


def headroom(intensity: float, flops_per_s: float, bytes_per_s: float) -> float:
    """intensity / required_flops_per_byte: > 1 compute-bound, < 1 communication-bound."""
    return _size("intensity", intensity) / required_flops_per_byte(flops_per_s, bytes_per_s)


def format_times(x: float) -> str:
    """A ratio as text: 7.4x below 10, 600x or 10,800x above."""
    return f"{x:.1f}x" if x < 10 else f"{x:,.0f}x"


def comm_verdict(intensity: float, flops_per_s: float, bytes_per_s: float) -> str:
    """One line: compute-bound with how much headroom, or comm-bound, by how much, and what
    share of the time compute can be busy: h with compute fully overlapping comm, h/(1+h) with
    no overlap (h = headroom)."""
    h = headroom(intensity, flops_per_s, bytes_per_s)
    if h >= 1:
        return f"compute-bound with {format_times(h)} headroom"
    return (f"comm-bound: short by {format_times(1 / h)}; compute busy at most {h:.0%} of the "
            f"time (full overlap), {h / (1 + h):.0%} with no overlap")
