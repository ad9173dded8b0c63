"""The ring in a trace (parlab.cp.trace): every step's ranges on every rank, the transfers
matched to the sends, and the hidden share of the version that waits first, which is 0 by
construction (it computes only once its transfer has arrived)."""

from __future__ import annotations

import pytest

from parlab.cp.trace import MODES, TRANSFERS, trace_ring

W = 3


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    return trace_ring(world_size=W, seq_len=96 * W, heads=2, head_dim=16, backward=True,
                      trace=tmp_path_factory.mktemp("cp") / "ring.json")


def test_every_step_is_a_range_in_order_on_every_rank(ring):
    tl = ring.timeline
    for mode in MODES:
        for rank in range(W):
            names = [r.name for r in tl.ranges(rank=rank, prefix="ring step",
                                               within=ring.windows[mode])]
            posted = [f"ring step {s} send/recv" for s in range(W - 1)]
            assert [n for n in names if n.endswith("compute")] == [
                f"ring step {s} compute" for s in range(W)], (mode, rank)  # non-causal
            assert [n for n in names if n.endswith("send/recv")] == posted, (mode, rank)
            assert [n for n in names if n.endswith("wait")] == [
                f"ring step {s} wait" for s in range(W - 1)], (mode, rank)
            # each receive of the step's K and V, from posting to arrival; at least those: the
            # window spans all ranks, so a rank that finished first can post the next barrier's
            # receive while a slower one is still in the ring (the next test pairs each step
            # with its own transfer)
            assert len(tl.ranges(rank=rank, match=TRANSFERS, within=ring.windows[mode])) >= (
                2 * (W - 1)), (mode, rank)
    backward = tl.ranges(rank=0, prefix="ring backward", within=ring.windows["forward+backward"])
    assert [r.name for r in backward if r.name.endswith("compute")] == [
        f"ring backward step {s} compute" for s in range(W)]


def test_each_transfer_starts_when_both_ends_posted_and_ends_when_it_arrived(ring):
    tl = ring.timeline
    for mode in MODES:
        window = ring.windows[mode]
        for rank, steps in enumerate(ring.transfers[mode]):
            assert [t.name for t in steps] == [f"ring step {s} transfer" for s in range(W - 1)]
            for s, t in enumerate(steps):
                mine = next(r for r in tl.ranges(rank=rank, within=window)
                            if r.name == f"ring step {s} send/recv")
                left = next(r for r in tl.ranges(rank=(rank - 1) % W, within=window)
                            if r.name == f"ring step {s} send/recv")
                assert t.start == max(mine.start, left.start)
                wait = next(r for r in tl.ranges(rank=rank, within=window)
                            if r.name == f"ring step {s} wait")
                assert t.end <= wait.end + 1e-4  # arrived before the wait returned


def test_the_ring_that_waits_first_hides_nothing(ring):
    assert ring.hidden["waits first"] == 0.0
    assert 0.0 <= ring.hidden["overlapped"] <= 1.0
    assert ring.block_bytes == 2 * 2 * 96 * 16 * 4  # K and V of one rank: 2 heads, fp32
