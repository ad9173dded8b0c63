r"""Ring attention, Ulysses and the all-gather: bytes, exposed communication and K/V memory per
layer, for one rank.

Both split a sequence of s tokens over c ranks, n = s/c each, for a layer with H query heads
and H_kv key/value heads of size D (h = HD features), b sequences, d bytes per element, on a
device of F FLOP/s behind a link of β bytes/s per direction.

Ring (`parlab.cp.ring`): K and V go round, $2bnH_{kv}D\,d$ bytes a step, c - 1 steps in the
forward; the backward sends K and V round again and the accumulators dK, dV c hops. Each
step's transfer flies while the block computes, $4bn^2HD$ FLOPs forward (2.5 times that
backward, `parlab.cp.block_backward_flops`), times the share of the block the causal mask
leaves (1/2 on average under a balanced layout): only the excess of transfer over compute is
exposed, $(c-1)\max(0, t_{xfer} - t_{block})$.

Ulysses (`parlab.cp.ulysses`): four all-to-alls forward, four backward
(`parlab.costs.ulysses_bytes_per_layer`), between dependent computations: exposed whole,
bytes / β (every rank sends its share at once, as over an NVSwitch or a fat tree).

So: Ulysses sends fewer bytes than the ring for MHA ($4\frac{c-1}{c^2}$ against
$2\frac{c-1}{c}$ of the layer's activation, c/2 times fewer), but exposes all of them; the
ring exposes nothing once its block is long enough, $n \ge \frac{F d H_{kv}}{2\beta H \sigma}$
(σ the causal share), which grouped-query attention makes H/H_kv times shorter. Ulysses
needs c to divide H and H_kv (`check_heads`); the ring does not.

All-gather (`parlab.cp.allgather`, Llama 3's scheme): K and V gathered once before attention,
$\frac{c-1}{c}\,2bsH_{kv}D\,d$, the same bytes as the ring's forward but in one collective
that waits on nothing and nothing waits behind, so exposed whole (bytes / β); backward the
reduce-scatter of dK, dV, the same bytes again (and the all-gather again when only the rank's
own K, V are kept between forward and backward, `regather`). Memory: every rank holds the
whole sequence's K and V during attention, c times its own share (`kv_bytes_held`), where the
ring holds its own block and two in flight, and Ulysses its own tokens and their head shard.
"""

from __future__ import annotations

from parlab.costs import ring_allgather_bytes, ring_reduce_scatter_bytes, ulysses_bytes_per_layer
from parlab.cp.layout import block_backward_flops, block_bytes, block_flops

__all__ = ["CP_KINDS", "ring_bytes_per_layer", "allgather_bytes_per_layer", "kv_bytes_held",
           "attention_comm"]

CP_KINDS = ("ring", "ulysses")


def ring_bytes_per_layer(b: int, s: int, h_kv: int, c: int, dtype_bytes: int = 2, *,
                         backward: bool = False) -> float:
    """Bytes a rank sends per layer in ring attention: K and V blocks (b s/c h_kv features
    each), c - 1 hops forward; backward adds c - 1 hops of K, V and c of dK, dV."""
    if c == 1:
        return 0.0
    block = b * s / c * h_kv * dtype_bytes  # K or V of this rank's tokens
    forward = 2 * (c - 1) * block
    return forward + (2 * (c - 1) + 2 * c) * block if backward else forward


def allgather_bytes_per_layer(b: int, s: int, h_kv: int, c: int, dtype_bytes: int = 2, *,
                              backward: bool = False, regather: bool = False) -> float:
    """Bytes a rank sends per layer in all-gather CP: the ring all-gather of K and V (b s h_kv
    features each), (c - 1)/c of them; backward adds the reduce-scatter of dK, dV, the same
    bytes (and the all-gather again with `regather`)."""
    if c == 1:
        return 0.0
    gather = 2 * ring_allgather_bytes(b * s * h_kv * dtype_bytes, c)  # K and V
    if not backward:
        return gather
    return gather + 2 * ring_reduce_scatter_bytes(b * s * h_kv * dtype_bytes, c) + (
        gather if regather else 0.0)


def kv_bytes_held(kind: str, *, b: int, s: int, h: int, h_kv: int, c: int,
                  dtype_bytes: int = 2) -> float:
    """Bytes of attention inputs (q, k, v) a rank holds at the peak of one layer's attention,
    h = H D and h_kv = H_kv D features, n = s/c tokens of its own: "ring" its own q, k, v and
    two K/V blocks in flight (the one computed, the one arriving), b n (h + 6 h_kv);
    "ulysses" its own q, k, v and their head shards (all s tokens of H/c heads, as many
    bytes), 2 b n (h + 2 h_kv); "allgather" its own q, k, v and the whole sequence's K and V,
    b n (h + 2 h_kv) + 2 b s h_kv. Times dtype_bytes."""
    own = b * s / c * dtype_bytes  # bytes per feature of this rank's tokens
    if kind == "ring":
        return own * (h + 6 * h_kv)
    if kind == "ulysses":
        return 2 * own * (h + 2 * h_kv)
    if kind == "allgather":
        return own * (h + 2 * h_kv) + 2 * b * s * h_kv * dtype_bytes
    raise ValueError(f"kind must be ring, ulysses or allgather, got {kind!r}")


def attention_comm(*, b: int, s: int, heads: int, head_dim: int, c: int, flops: float,
                   bandwidth: float, kv_heads: int | None = None, dtype_bytes: int = 2,
                   causal: bool = True, backward: bool = False) -> dict[str, float | bool | str]:
    """One rank, one layer (forward, or forward and backward): what ring and Ulysses send and
    how much of it the computation does not hide (module docstring).

    Keys: "ring_bytes", "ulysses_bytes", "allgather_bytes", "block_s" and "xfer_s" (one ring
    step's compute and transfer, forward), "ring_exposed_s", "ulysses_exposed_s",
    "allgather_exposed_s", "ulysses_allowed" (c divides both head counts), "cheaper" ("ring",
    "ulysses" or "equal", between those two; "ring" when Ulysses is not allowed)."""
    kv = heads if kv_heads is None else kv_heads
    n, share = s / c, 0.5 if causal else 1.0
    block_s = b * block_flops(1, head_dim, heads) * n * n * share / flops
    xfer_s = b * block_bytes(1, head_dim, kv, dtype_bytes) * n / bandwidth
    ring_exposed = (c - 1) * max(0.0, xfer_s - block_s)
    if backward and c > 1:
        back_s = block_s * block_backward_flops(1, 1) / block_flops(1, 1)
        ring_exposed += (c - 1) * max(0.0, 2 * xfer_s - back_s) + xfer_s  # dK, dV last hop
    ring = ring_bytes_per_layer(b, s, kv * head_dim, c, dtype_bytes, backward=backward)
    uly = ulysses_bytes_per_layer(b, s, heads * head_dim, c, dtype_bytes,
                                  h_kv=kv * head_dim, backward=backward) if c > 1 else 0.0
    allowed = heads % c == 0 and kv % c == 0
    uly_exposed = uly / bandwidth
    gather = allgather_bytes_per_layer(b, s, kv * head_dim, c, dtype_bytes, backward=backward)
    cheaper = ("ring" if not allowed or ring_exposed < uly_exposed else
               "ulysses" if uly_exposed < ring_exposed else "equal")
    return {"ring_bytes": ring, "ulysses_bytes": uly, "block_s": block_s, "xfer_s": xfer_s,
            "ring_exposed_s": ring_exposed, "ulysses_exposed_s": uly_exposed,
            "allgather_bytes": gather, "allgather_exposed_s": gather / bandwidth,
            "ulysses_allowed": allowed, "cheaper": cheaper}
