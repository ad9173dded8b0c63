"""parlab.cp, cp_fused, cp_layout, cp_ring, cp_measure: context parallelism against independent
references.

References: torch's own scaled_dot_product_attention (with a boolean mask built in the test
from positions), torch.logsumexp of scores computed here, autograd through SDPA, and layouts
and work counts written out by hand. Float64 wherever equality up to rounding is meant
(rtol 1e-10: blocking only reorders sums); float32 with large scores against a float64
reference at rtol 1e-4 (exp amplifies the rounding of scores near 200).
"""

from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from parlab import comm, cp
from parlab.check import CheckFailed
from parlab.cp import fused as cp_fused
from parlab.cp import layout as cp_layout
from parlab.cp import measure as cp_measure
from parlab.cp import ring as cp_ring
from parlab.errors import reference_message, refused
from parlab.launch import run

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
pytestmark = pytest.mark.usefixtures("no_orphans")

F64 = {"rtol": 1e-10, "atol": 1e-12}
LAYOUTS = ("contiguous", "striped", "zigzag")


def _randn(*shape, seed=0, dtype=torch.float64, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).mul(scale).to(dtype)


def _sdpa(q, k, v, q_pos, k_pos, causal):
    """torch's attention with the mask of global positions (key j visible iff k_pos[j] <=
    q_pos[i]); lse from torch.logsumexp of the same masked scores."""
    mask = (k_pos[None, :] <= q_pos[:, None]) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~mask, float("-inf"))
    return out, torch.logsumexp(s, dim=-1)


# --- block attention and the merge -------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_block_attention_matches_torch(causal):
    q, k, v = (_randn(2, 3, n, 8, seed=i) for i, n in enumerate((5, 7, 7)))
    q_pos, k_pos = torch.tensor([3, 9, 4, 12, 6]), torch.tensor([0, 2, 4, 6, 8, 10, 12])
    out, lse = cp.block_attention(q, k, v, q_pos, k_pos, causal=causal)
    want_out, want_lse = _sdpa(q, k, v, q_pos, k_pos, causal)
    torch.testing.assert_close(out, want_out, **F64)
    torch.testing.assert_close(lse, want_lse, **F64)


def test_fully_masked_rows_give_zero_and_minus_infinity():
    q, k, v = (_randn(1, 2, 3, 4, seed=i) for i in range(3))
    out, lse = cp.block_attention(q, k, v, torch.tensor([0, 1, 5]), torch.tensor([2, 3, 4]),
                                  causal=True)
    assert torch.equal(out[..., :2, :], torch.zeros(1, 2, 2, 4, dtype=torch.float64))
    assert torch.isneginf(lse[..., :2]).all() and torch.isfinite(lse[..., 2]).all()
    assert not torch.isnan(out).any()


def test_block_attention_keeps_float32_partials_for_bf16_inputs():
    q, k, v = (_randn(1, 1, 4, 8, seed=i, dtype=torch.bfloat16) for i in range(3))
    out, lse = cp.block_attention(q, k, v, torch.arange(4), torch.arange(4), causal=True)
    assert out.dtype == lse.dtype == torch.float32


@pytest.mark.parametrize("causal", [False, True])
def test_merging_any_split_in_any_order_is_exact(causal):
    q, k, v = _randn(1, 2, 6, 8, seed=1), _randn(1, 2, 20, 8, seed=2), _randn(1, 2, 20, 8, seed=3)
    q_pos, k_pos = torch.tensor([0, 3, 7, 11, 15, 19]), torch.arange(20)
    want_out, want_lse = _sdpa(q, k, v, q_pos, k_pos, causal)
    blocks = [torch.tensor(b) for b in ([17, 2, 9], [0, 1], [19, 18, 16, 15], [3, 4, 5, 6, 7, 8],
                                        [10, 11, 12, 13, 14])]  # [15..19] masked for most rows
    acc = cp.empty_partial(q)
    for b in blocks:
        acc = cp.merge_partials(*acc, *cp.block_attention(q, k[..., b, :], v[..., b, :], q_pos, b,
                                                          causal=causal))
    torch.testing.assert_close(acc[0], want_out, **F64)
    torch.testing.assert_close(acc[1], want_lse, **F64)


def test_merging_two_fully_masked_blocks_gives_the_empty_partial():
    q = _randn(1, 1, 2, 4)
    a, b = cp.empty_partial(q), cp.empty_partial(q)
    out, lse = cp.merge_partials(*a, *b)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_merge_in_float32_survives_scores_past_the_exp_limit():
    q = _randn(1, 2, 6, 8, seed=4, dtype=torch.float32, scale=60.0)
    k, v = _randn(1, 2, 16, 8, seed=5, dtype=torch.float32), _randn(1, 2, 16, 8, seed=6,
                                                                    dtype=torch.float32)
    pos = torch.arange(16)
    parts = [cp.block_attention(q, k[..., b, :], v[..., b, :], pos[:6], b, causal=False)
             for b in (pos[:8], pos[8:])]
    assert float(torch.stack([p[1] for p in parts]).max()) > math.log(torch.finfo().max)
    out, lse = cp.merge_partials(*parts[0], *parts[1])
    want_out, want_lse = _sdpa(q.double(), k.double(), v.double(), pos[:6], pos, False)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_block_backward_sums_to_autograd(causal):
    q, k, v, dout = (_randn(1, 2, 12, 8, seed=10 + i) for i in range(4))
    pos = torch.arange(12)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    (out * dout).sum().backward()
    _, lse = _sdpa(q, k, v, pos, pos, causal)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for b in (pos[:5], pos[5:9], pos[9:]):
        dq_b, dk_b, dv_b = cp.block_attention_backward(q, k[..., b, :], v[..., b, :],
                                                       out.detach(), lse, dout, pos, b,
                                                       causal=causal)
        dq += dq_b
        dk[..., b, :] += dk_b
        dv[..., b, :] += dv_b
    for got, leaf in zip((dq, dk, dv), leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, **F64)


def test_refused_references_raise_and_lift():
    q = _randn(1, 1, 2, 4)
    with refused([cp.merge_partials, cp_layout.layout_positions], reference_message("them")):
        with pytest.raises(CheckFailed, match="course's own reference"):
            cp.merge_partials(*cp.empty_partial(q), *cp.empty_partial(q))
        with pytest.raises(CheckFailed):
            cp_layout.layout_positions("striped", 0, 2, 8)
    cp_layout.layout_positions("striped", 0, 2, 8)


# --- layouts and work --------------------------------------------------------------------------

def test_layouts_by_hand():
    table = {lay: cp_layout.position_table(lay, 4, 16).tolist() for lay in LAYOUTS}
    assert table["contiguous"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert table["striped"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert table["zigzag"] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    with pytest.raises(ValueError, match="divisible by 8"):
        cp_layout.position_table("zigzag", 4, 12)
    with pytest.raises(ValueError, match="layout must be one of"):
        cp_layout.layout_positions("diagonal", 0, 2, 8)


@pytest.mark.parametrize("world, n", [(2, 4), (3, 6), (4, 8), (8, 16)])
def test_causal_work_closed_forms(world, n):
    m, seq = n // 2, world * n
    assert cp_layout.causal_work(cp_layout.position_table("contiguous", world, seq)) == [
        r * n * n + n * (n + 1) // 2 for r in range(world)]
    assert cp_layout.causal_work(cp_layout.position_table("striped", world, seq)) == [
        n * (r + 1) + world * n * (n - 1) // 2 for r in range(world)]
    assert cp_layout.causal_work(cp_layout.position_table("zigzag", world, seq)) == [
        (2 * world - 1) * m * m + m * (m + 1)] * world


def test_step_work_and_pace_by_hand():
    world, n = 4, 8
    contiguous = cp_layout.step_work(cp_layout.position_table("contiguous", world, world * n))
    want = [[n * (n + 1) // 2 if s == 0 else (n * n if s <= r else 0) for s in range(world)]
            for r in range(world)]  # block (r - s) % W is in the past iff s <= r
    assert contiguous.tolist() == want
    assert cp_layout.ring_pace(contiguous) == n * (n + 1) // 2 + (world - 1) * n * n
    zigzag = cp_layout.step_work(cp_layout.position_table("zigzag", world, world * n))
    assert (zigzag[:, 1:] == n * n // 2).all()  # every later step: exactly half a block
    assert zigzag.sum(1).tolist() == cp_layout.causal_work(
        cp_layout.position_table("zigzag", world, world * n))
    plain = cp_layout.step_work(cp_layout.position_table("striped", world, world * n),
                                causal=False)
    assert (plain == n * n).all()


def test_hiding_threshold_by_hand():
    # n >= F d / (2 beta): 1e15 * 2 / (2 * 450e9) = 2222.2 tokens; half-masked blocks double it
    assert cp_layout.min_hiding_block(1e15, 450e9, 2) == pytest.approx(1e15 / 450e9)
    assert cp_layout.min_hiding_block(1e15, 50e9, 2, causal_share=0.5) == pytest.approx(40000)
    assert cp_layout.block_flops(16, 8, heads=2) == 4 * 2 * 16 * 16 * 8
    assert cp_layout.block_bytes(16, 8, heads=2, dtype_bytes=2) == 2 * 2 * 16 * 8 * 2
    n = cp_layout.min_hiding_block(1e15, 450e9, 2)  # compute time == transfer time there
    assert cp_layout.block_flops(n, 128) / 1e15 == pytest.approx(
        cp_layout.block_bytes(n, 128) / 450e9)
    with pytest.raises(ValueError):
        cp_layout.min_hiding_block(1e15, 0, 2)


def test_block_flops_are_what_torch_counts():
    # torch's own FLOP counter, 2 m n k per matrix product: the forward's QK^T and PV, and the
    # backward's five (S recomputed, dV, dP, dQ, dK); the notebook's "2.5 times" is their ratio
    from torch.utils.flop_counter import FlopCounterMode

    heads, n, d = 3, 6, 8
    q, k, v, dout = (_randn(1, heads, n, d, seed=40 + i) for i in range(4))
    pos = torch.arange(n)
    with FlopCounterMode(display=False) as forward:
        out, lse = cp.block_attention(q, k, v, pos, pos, causal=False)
    with FlopCounterMode(display=False) as backward:
        cp.block_attention_backward(q, k, v, out, lse, dout, pos, pos, causal=False)
    assert forward.get_total_flops() == cp_layout.block_flops(n, d, heads)
    assert backward.get_total_flops() == cp_layout.block_backward_flops(n, d, heads)


# --- the fused block (parlab.cp.fused) -----------------------------------------------------------

def _pieces(q_pos, k_pos):
    return [(p.q0, p.q1, p.k0, p.k1, p.causal)
            for p in cp_fused.plan(q_pos, k_pos, causal=True)]


def test_fused_plan_cuts_each_layouts_blocks_by_hand():
    world, n = 4, 8
    m = n // 2
    table = {lay: cp_layout.position_table(lay, world, world * n) for lay in LAYOUTS}
    for r in range(world):
        for s in range(world):
            # contiguous: earlier block full, own block causal, later block skipped
            assert _pieces(table["contiguous"][r], table["contiguous"][s]) == (
                [(0, n, 0, n, False)] if s < r else [(0, n, 0, n, True)] if s == r else [])
            # striped: j <= i for s <= r (is_causal); j < i for s > r (row 0 sees nothing,
            # rows 1.. against keys ..n-2 are is_causal)
            assert _pieces(table["striped"][r], table["striped"][s]) == (
                [(0, n, 0, n, True)] if s <= r else [(1, n, 0, n - 1, True)])
            # zigzag: own block causal; earlier: all queries, its first half of keys;
            # later: the second half of queries, all keys
            assert _pieces(table["zigzag"][r], table["zigzag"][s]) == (
                [(0, n, 0, n, True)] if s == r else [(0, n, 0, m, False)] if s < r
                else [(m, n, 0, n, False)])
    assert cp_fused.plan(torch.arange(3), torch.arange(5), causal=False) == [
        cp_fused.Piece(0, 3, 0, 5, False)]
    assert cp_fused.plan(torch.tensor([2, 1]), torch.arange(3), causal=True) is None


def _fused_ring_on_one_process(q, k, v, dout, table, rank, causal):
    """Rank `rank`'s ring, simulated: its queries meet every block in ring order through the
    fused kernel, partials merged; then the backward's block terms, summed."""
    world = table.shape[0]
    mine = table[rank]
    qr, do = q[..., mine, :], dout[..., mine, :]
    acc = cp.empty_partial(qr)
    for step in range(world):
        src = table[(rank - step) % world]
        acc = cp.merge_partials(*acc, *cp.fused_attention(qr, k[..., src, :], v[..., src, :],
                                                          mine, src, causal=causal))
    out, lse = acc
    dq, dk, dv = torch.zeros_like(qr), torch.zeros_like(k), torch.zeros_like(v)
    for src in table:
        dq_b, dk_b, dv_b = cp.fused_attention_backward(qr, k[..., src, :], v[..., src, :], out,
                                                       lse, do, mine, src, causal=causal)
        dq += dq_b
        dk[..., src, :] += dk_b
        dv[..., src, :] += dv_b
    return out, lse, (dq, dk, dv)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_fused_ring_matches_torch_sdpa_on_one_process(world, layout, causal):
    seq = 8 * world
    q, k, v, dout = (_randn(2, 3, seq, 16, seed=50 + i) for i in range(4))
    pos, table = torch.arange(seq), cp_layout.position_table(layout, world, seq)
    for rank in range(world):
        mine = table[rank]
        leaves = [q[..., mine, :].clone().requires_grad_(), k.clone().requires_grad_(),
                  v.clone().requires_grad_()]
        mask = (pos[None, :] <= mine[:, None]) if causal else None
        want = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        (want * dout[..., mine, :]).sum().backward()
        _, want_lse = _sdpa(q[..., mine, :], k, v, mine, pos, causal)
        out, lse, grads = _fused_ring_on_one_process(q, k, v, dout, table, rank, causal)
        torch.testing.assert_close(out, want.detach(), **F64)
        torch.testing.assert_close(lse, want_lse, **F64)
        for got, leaf in zip(grads, leaves, strict=True):
            torch.testing.assert_close(got, leaf.grad, **F64)


def _against_block_kernel(q_pos, k_pos, seed):
    q = _randn(1, 2, len(q_pos), 8, seed=seed)
    k, v = _randn(1, 2, len(k_pos), 8, seed=seed + 1), _randn(1, 2, len(k_pos), 8, seed=seed + 2)
    out, lse = cp.fused_attention(q, k, v, q_pos, k_pos, causal=True)
    want_out, want_lse = cp.block_attention(q, k, v, q_pos, k_pos, causal=True)
    torch.testing.assert_close(out, want_out, **F64)
    torch.testing.assert_close(lse, want_lse, **F64)  # -inf where a row sees no key
    # the backward with a full row's out and lse: merge a block every query sees
    extra_k, extra_v = _randn(1, 2, 3, 8, seed=seed + 3), _randn(1, 2, 3, 8, seed=seed + 4)
    before = torch.full((3,), -1)
    full = cp.merge_partials(out, lse, *cp.block_attention(q, extra_k, extra_v, q_pos, before,
                                                            causal=True))
    dout = _randn(*out.shape, seed=seed + 5)
    got = cp.fused_attention_backward(q, k, v, *full, dout, q_pos, k_pos, causal=True)
    want = cp.block_attention_backward(q, k, v, *full, dout, q_pos, k_pos, causal=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **F64)


def test_fused_block_with_many_pieces_or_unsorted_positions_still_matches():
    q_pos, k_pos = torch.tensor([0, 3, 4, 5, 9, 14, 15, 30]), torch.arange(1, 20)
    pieces = cp_fused.plan(q_pos, k_pos, causal=True)
    assert pieces is not None and len(pieces) > cp_fused.MAX_PIECES  # the masked call
    _against_block_kernel(q_pos, k_pos, seed=60)
    _against_block_kernel(torch.tensor([2, 5, 6, 7]), torch.tensor([0, 3, 4, 6, 7]), seed=66)
    _against_block_kernel(torch.tensor([9, 1, 5]), torch.tensor([4, 0, 8, 2]), seed=70)  # falls
    # back to the block kernel


def test_fused_merge_is_merge_partials_in_place():
    q, k, v = _randn(1, 2, 5, 8, seed=80), _randn(1, 2, 12, 8, seed=81), _randn(1, 2, 12, 8,
                                                                              seed=82)
    q_pos, keys = torch.tensor([1, 3, 6, 8, 11]), torch.arange(12)
    blocks = [keys[:4], keys[4:8], keys[8:]]  # row 0 sees only block 0; rows 0-1 not block 2
    parts = [cp.block_attention(q, k[..., b, :], v[..., b, :], q_pos, b, causal=True)
             for b in blocks]
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        got, want = cp.empty_partial(q), cp.empty_partial(q)
        for i in order:
            got = cp_fused.merge_into(*got, *(t.clone() for t in parts[i]))
            want = cp.merge_partials(*want, *parts[i])
        torch.testing.assert_close(got[0], want[0], **F64)
        torch.testing.assert_close(got[1], want[1], **F64)
    masked = cp.block_attention(q[..., :2, :], k[..., 8:, :], v[..., 8:, :], q_pos[:2],
                                keys[8:], causal=True)  # every row -inf
    both = cp_fused.merge_into(*(t.clone() for t in masked), *masked)
    assert torch.equal(both[0], torch.zeros_like(both[0])) and torch.isneginf(both[1]).all()
    big = [cp.block_attention(q.float() * 60, k[..., b, :].float(), v[..., b, :].float(),
                              torch.arange(5), b, causal=False) for b in blocks[:2]]
    got = cp_fused.merge_into(*big[0], *big[1])  # lse past float32's exp limit
    want = cp.merge_partials(*cp.block_attention(q.float() * 60, k[..., :4, :].float(),
                                                 v[..., :4, :].float(), torch.arange(5),
                                                 blocks[0], causal=False), *big[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_fused_block_keeps_float32_partials_for_bf16_inputs():
    q, k, v = (_randn(1, 1, 4, 8, seed=i, dtype=torch.bfloat16) for i in range(3))
    out, lse = cp.fused_attention(q, k, v, torch.arange(4), torch.arange(4), causal=True)
    assert out.dtype == lse.dtype == torch.float32


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _kernel_worker(layouts, fused):
    rank, world = dist.get_rank(), dist.get_world_size()
    cp_ring.FUSED = fused
    logs = {}
    for layout in layouts:
        pos = cp_layout.position_table(layout, world, 8 * world)
        q, k, v = (_randn(1, 2, 8, 4, seed=rank + 10 * i).requires_grad_() for i in range(3))
        with _OpLog() as log:
            cp_ring.ring_attention(q, k, v, pos, causal=True).sum().backward()
        logs[layout] = log.ops
    return logs


def test_the_reference_ring_computes_its_blocks_in_the_fused_kernel():
    world = 4
    for rank, logs in enumerate(run(_kernel_worker, world, LAYOUTS, True)):
        for layout, ops in logs.items():
            table = cp_layout.position_table(layout, world, 8 * world)
            calls = sum(len(cp_fused.plan(table[rank], src, causal=True)) for src in table)
            assert ops.count("_scaled_dot_product_flash_attention_for_cpu.default") == calls
            assert ops.count(
                "_scaled_dot_product_flash_attention_for_cpu_backward.default") == calls
            assert "logsumexp.default" not in ops  # no score matrix formed anywhere
    for logs in run(_kernel_worker, 2, ("striped",), False):  # the switch: the block kernel
        assert "logsumexp.default" in logs["striped"]
        assert not any("flash" in op for op in logs["striped"])


# --- the ring ------------------------------------------------------------------------------------

def _ring_worker(q, k, v, dout, layout, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    pos = cp_layout.position_table(layout, world, q.shape[-2])
    mine = pos[rank]
    leaves = [x[..., mine, :].clone().requires_grad_() for x in (q, k, v)]
    with comm.trace() as tr:
        out = cp_ring.ring_attention(*leaves, pos, causal=causal)
    with comm.trace() as back:
        (out * dout[..., mine, :]).sum().backward()
    waited, lse = cp_ring.ring_attention_forward(*(x.detach() for x in leaves), pos,
                                                 causal=causal, overlap=False)
    return {"out": out.detach(), "grads": [x.grad for x in leaves], "lse": lse,
            "waited": waited, "fwd": [(e.kind, e.group_ranks, e.nbytes) for e in tr.events],
            "bwd": [(e.kind, e.group_ranks, e.nbytes) for e in back.events]}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_ring_matches_torch_forward_and_backward(world, layout, causal):
    seq = 4 * world
    q, k, v, dout = (_randn(1, 2, seq, 8, seed=20 + i) for i in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    (want * dout).sum().backward()
    pos = torch.arange(seq)
    _, want_lse = _sdpa(q, k, v, pos, pos, causal)
    table = cp_layout.position_table(layout, world, seq)
    block = 1 * 2 * (seq // world) * 8 * 8  # bytes of one K (or V) block, float64
    for rank, res in enumerate(run(_ring_worker, world, q, k, v, dout, layout, causal)):
        mine = table[rank]
        torch.testing.assert_close(res["out"], want.detach()[..., mine, :], **F64)
        torch.testing.assert_close(res["waited"], want.detach()[..., mine, :], **F64)
        torch.testing.assert_close(res["lse"], want_lse[..., mine], **F64)
        for got, leaf in zip(res["grads"], leaves, strict=True):
            torch.testing.assert_close(got, leaf.grad[..., mine, :], **F64)
        right, left = (rank + 1) % world, (rank - 1) % world
        assert {(kind, peer) for kind, peer, _ in res["fwd"]} == {("isend", (right,)),
                                                                  ("irecv", (left,))}
        sends = [n for kind, _, n in res["fwd"] if kind == "isend"]
        assert sum(sends) == 2 * (world - 1) * block  # K and V, W - 1 hops
        back = [n for kind, _, n in res["bwd"] if kind == "isend"]
        assert sum(back) == 2 * (world - 1) * block + 2 * world * block  # + dK, dV: W hops


def _backward_shift_worker(causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    seq = 4 * world
    q, k, v, dout = (_randn(1, 2, seq, 8, seed=30 + i)[..., 4 * rank:4 * rank + 4, :]
                     for i in range(4))
    pos = torch.arange(seq).view(world, 4)
    out, lse = cp_ring.ring_attention_forward(q, k, v, pos, causal=causal)
    posted = []

    def recording(tensors, *, group=None):  # shift_right, counting what it is given
        posted.append(len(tensors))
        return cp_ring.shift_right(tensors, group=group)

    mine = cp_ring.ring_attention_backward(q, k, v, out, lse, dout, pos, causal=causal,
                                           shift=recording)
    default = cp_ring.ring_attention_backward(q, k, v, out, lse, dout, pos, causal=causal)
    return {"posted": posted, "mine": mine, "default": default}


@pytest.mark.parametrize("causal", [False, True])
def test_ring_backward_posts_every_transfer_through_the_given_shift(causal):
    # the shift bench_cp replaces: W - 1 K/V transfers and W of the dK, dV accumulators
    world = 3
    for res in run(_backward_shift_worker, world, causal):
        assert sorted(res["posted"]) == [2] * (2 * world - 1)
        for got, want in zip(res["mine"], res["default"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _overlap_worker(overlap):
    rank, world = dist.get_rank(), dist.get_world_size()
    seq = 4 * world
    q, k, v = (_randn(1, 1, seq, 4, seed=i)[..., 4 * rank:4 * rank + 4, :] for i in range(3))
    events = []

    def hear(phase, event):
        if phase == "start" and event.kind in ("irecv", "wait(irecv)"):
            events.append(event.kind)

    def attend(*args, **kwargs):  # the ring's own extension point: the block it computes
        events.append("compute")
        return cp.block_attention(*args, **kwargs)

    comm.add_listener(hear)
    try:
        cp_ring.ring_attention_forward(q, k, v, cp_layout.position_table(
            "contiguous", world, seq), causal=False, overlap=overlap, attend=attend)
    finally:
        comm.remove_listener(hear)
    in_flight, flying = [], 0
    for kind in events:
        flying += {"irecv": 1, "wait(irecv)": -1}.get(kind, 0)
        if kind == "compute":
            in_flight.append(flying > 0)
    return in_flight


@pytest.mark.parametrize("world", [2, 4])
def test_each_block_computes_while_the_next_flies(world):
    for in_flight in run(_overlap_worker, world, True):
        assert in_flight == [True] * (world - 1) + [False]  # the last step receives nothing
    for in_flight in run(_overlap_worker, world, False):
        assert in_flight == [False] * world


def _subgroup_worker(q, k, v):
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[rank // 2]
    pos = cp_layout.position_table("zigzag", 2, q.shape[-2])
    mine = pos[rank % 2]
    out, _ = cp_ring.ring_attention_forward(q[..., mine, :], k[..., mine, :], v[..., mine, :],
                                            pos, causal=True, group=group)
    return out


def test_ring_runs_inside_a_process_group():
    q, k, v = (_randn(1, 2, 8, 4, seed=30 + i) for i in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    pos = cp_layout.position_table("zigzag", 2, 8)
    for rank, out in enumerate(run(_subgroup_worker, 4, q, k, v)):
        torch.testing.assert_close(out, want[..., pos[rank % 2], :], **F64)


# --- measurements --------------------------------------------------------------------------------

def test_measured_work_is_the_closed_form():
    world, seq = 4, 32
    measured = cp_measure.measure_work(world_size=world, seq_len=seq)
    n = seq // world
    assert measured["contiguous"]["per_rank"].tolist() == [r * n * n + n * (n + 1) // 2
                                                           for r in range(world)]
    assert measured["zigzag"]["per_rank"].tolist() == [(2 * world - 1) * 16 + 4 * 5] * world
    assert measured["contiguous"]["steps"].tolist() == [  # [rank, step]: skipped blocks count 0
        [n * (n + 1) // 2 if s == 0 else (n * n if s <= r else 0) for s in range(world)]
        for r in range(world)]
    for m in measured.values():
        assert m["error"] < 1e-12
        assert m["steps"].sum(1).tolist() == m["per_rank"].tolist()


def test_overlap_measurement_structure_and_sleep_bounds():
    # Only lower bounds, which the sleeps guarantee: no wall-time ceiling in a unit test.
    cost, link, world = 0.02, 0.01, 2
    result = cp_measure.measure_overlap(world_size=world, tokens=256, block_cost=cost,
                                        link_time=link, repeats=1)
    assert result["cost_s"] == cost and result["link_s"] == link
    assert result["compute_s"] == pytest.approx(world * cost)
    assert result["model"]["waits first"] == pytest.approx(world * cost + (world - 1) * link)
    assert result["bytes"] == 2 * 1 * 4 * 256 * 64 * 4  # K and V, (1, 4, 256, 64) float32
    assert result["transfer_s"] > 0
    assert result["best"]["overlapped"] >= world * cost
    assert result["best"]["waits first"] >= world * cost + (world - 1) * link
    for mode in ("overlapped", "waits first"):
        for events in result["timelines"][mode]:
            computes = [e for e in events if e[0] == "compute"]
            transfers = [e for e in events if e[0] == "transfer"]
            assert len(computes) == world and all(e - s >= cost for _, s, e in computes)
            assert len(transfers) == world - 1 and all(e - s >= link for _, s, e in transfers)
