"""parlab.check.collectives catches wrong answers to module 00, and parlab.widgets.figures draws.

Each wrong ring all-reduce below is a mistake learners make; the check must fail it with
CheckFailed (or, for the deadlock, within the timeout) and a message naming the mistake. The
correct reference must pass on 2, 3 and 4 ranks, including lengths that t does not divide.
Expected values come from dist.all_reduce and parlab.costs, never from the code under test.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import matplotlib
import pytest
import torch
import torch.distributed as dist

from parlab import costs
from parlab.check import CheckFailed
from parlab.check.collectives import (
    check_intensities,
    check_placement,
    check_ring_allreduce,
    decode,
    make_input,
)
from parlab.widgets import figures

matplotlib.use("Agg")
# Send this module's functions to the ranks by value, as a notebook cell's are: otherwise every
# rank would import this file (and matplotlib) before it could start.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("no_orphans")


# --- ring all-reduces: one right, several wrong ----------------------------------------------

def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    posts = [lambda: dist.irecv(recv, left), lambda: dist.isend(send.contiguous(), right)]
    if dist.get_rank() % 2 == 0:  # NCCL's order: even ranks send first (nccl_rules)
        posts.reverse()
    for req in [post() for post in posts]:
        req.wait()


def ring_ok(x, *, all_gather=True, rs_offset=0, ag_copy=True):
    """A ring all-reduce; the keyword arguments switch on mistakes for the tests."""
    r, t = dist.get_rank(), dist.get_world_size()
    out = x.clone()
    if t == 1:
        return out
    chunks = list(torch.tensor_split(out, t))
    right, left = (r + 1) % t, (r - 1) % t
    for s in range(t - 1):  # reduce-scatter: after it rank r owns chunk (r + 1) % t
        send_i, recv_i = (r - s + rs_offset) % t, (r - s - 1) % t
        buf = torch.empty_like(chunks[recv_i])
        _exchange(chunks[send_i], buf, right, left)
        chunks[recv_i] += buf
    if not all_gather:
        return out
    for s in range(t - 1):  # all-gather: pass the finished chunks around
        send_i, recv_i = (r + 1 - s) % t, (r - s) % t
        buf = torch.empty_like(chunks[recv_i])
        _exchange(chunks[send_i], buf, right, left)
        if ag_copy:
            chunks[recv_i].copy_(buf)
        else:
            chunks[recv_i] += buf
    return out


def ring_uses_all_reduce(x):
    y = x.clone()
    dist.all_reduce(y)
    return y


def ring_reduce_scatter_only(x):
    return ring_ok(x, all_gather=False)


def ring_off_by_one(x):
    return ring_ok(x, rs_offset=1)


def ring_adds_in_all_gather(x):
    return ring_ok(x, ag_copy=False)


def ring_whole_tensors(x):
    """Right values, wrong traffic: passes the whole accumulated tensor round the ring."""
    r, t = dist.get_rank(), dist.get_world_size()
    total, travelling = x.clone(), x.clone()
    for _ in range(t - 1):
        buf = torch.empty_like(travelling)
        _exchange(travelling, buf, (r + 1) % t, (r - 1) % t)
        total += buf
        travelling = buf
    return total


def ring_blocking_send_first(x):
    r, t = dist.get_rank(), dist.get_world_size()
    buf = torch.empty_like(x)
    dist.send(x, (r + 1) % t)  # every rank sends first: nobody is receiving
    dist.recv(buf, (r - 1) % t)
    return x + buf


def ring_returns_input(x):
    return x


def ring_changes_dtype(x):
    return ring_ok(x).double()


def ring_returns_own_chunk(x):
    out = ring_ok(x)
    return torch.tensor_split(out, dist.get_world_size())[0].clone()


@pytest.mark.parametrize("t", [2, 3, 4])
@pytest.mark.parametrize("numel", [1024, 13])
def test_reference_ring_passes(t, numel, capsys):
    check_ring_allreduce(ring_ok, world_size=t, numel=numel)
    assert f"OK on {t} ranks" in capsys.readouterr().out


@pytest.mark.parametrize("t,numel,dtype", [(4, 3, torch.float32), (3, 1001, torch.float64),
                                           (2, 1, torch.float64)])
def test_reference_ring_passes_edge_cases(t, numel, dtype):
    check_ring_allreduce(ring_ok, world_size=t, numel=numel, dtype=dtype, quiet=True)


WRONG = [
    (ring_uses_all_reduce, 2, "you called all_reduce: build the all-reduce from send/recv"),
    (ring_reduce_scatter_only, 2, "only one chunk is complete: did you skip the all-gather"),
    (ring_reduce_scatter_only, 4, "only one chunk is complete: did you skip the all-gather"),
    (ring_whole_tensors, 4, "are you sending whole tensors"),
    (ring_off_by_one, 4, "a chunk index is off"),
    (ring_adds_in_all_gather, 4, "copy the received chunk"),
    (ring_returns_input, 2, "sent nothing"),
    (ring_changes_dtype, 2, "keep x's dtype"),
    (ring_returns_own_chunk, 4, "yours is one chunk long"),
]


@pytest.mark.parametrize("fn,t,needle", WRONG, ids=[f"{w[0].__name__}-{w[1]}" for w in WRONG])
def test_wrong_ring_is_caught_with_a_message(fn, t, needle):
    with pytest.raises(CheckFailed) as info:
        check_ring_allreduce(fn, world_size=t, quiet=True)
    assert needle in str(info.value)
    if fn is not ring_uses_all_reduce and fn is not ring_returns_input:
        assert "rank " in str(info.value)  # says where


def test_value_failure_names_rank_chunk_and_values():
    with pytest.raises(CheckFailed) as info:
        check_ring_allreduce(ring_reduce_scatter_only, world_size=4, quiet=True)
    msg = str(info.value)
    assert msg.startswith("rank 0: input 'tagged'")
    assert "chunk 0 of 4" in msg and "expected" in msg and "summed over rank" in msg
    assert "2*3/4" in msg  # and the traffic is half of a ring's


def test_deadlock_fails_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(CheckFailed) as info:
        check_ring_allreduce(ring_blocking_send_first, world_size=2, timeout=2.0, quiet=True)
    assert time.monotonic() - start < 2.0 + 8.0
    assert "did not finish" in str(info.value) and "blocking" in str(info.value)
    assert "waiting in send" in str(info.value)  # the launcher's per-rank state


def test_reexport_is_rejected():
    with pytest.raises(CheckFailed, match="course's own"):
        check_ring_allreduce(costs.ring_allreduce_bytes, quiet=True)


def test_tagged_input_decodes():
    t, n = 4, 8
    xs = [make_input("tagged", r, t, n, torch.float64) for r in range(t)]
    assert decode(float(xs[1][5] + xs[2][5]), t) == ([0, 1, 1, 0], 5)
    assert decode(float(2 * xs[0][3]), t) == ([2, 0, 0, 0], 3)
    assert decode(float(xs[0][3] + xs[1][4]), t) is None  # mixed elements


# --- interconnect functions ------------------------------------------------------------------

def tp_ok(h):
    return float(h)


def dp_ok(n_tokens):
    return 3.0 * n_tokens


def link_ok(flops_per_s, bytes_per_s):
    return flops_per_s / bytes_per_s


def placement_ok(h, n_tokens, flops_per_s, bytes_per_s):
    need = link_ok(flops_per_s, bytes_per_s)
    out = {}
    for key, offered in (("tp", tp_ok(h)), ("dp", dp_ok(n_tokens))):
        out[key] = {"compute_bound": offered / need >= 1, "headroom": offered / need}
    return out


def test_reference_interconnect_passes():
    check_intensities(tp_ok, dp_ok, link_ok, random_points=50, seed=3, quiet=True)
    check_placement(placement_ok, random_points=50, seed=3, quiet=True)


@pytest.mark.parametrize("tp,dp,link,needle", [
    (lambda h: float(h) ** 2, dp_ok, link_ok, "divide by the bytes moved"),
    (tp_ok, lambda n: 6.0 * n, link_ok, "you counted the all-reduce as P"),
    (tp_ok, lambda n: float(n), link_ok, "you counted the forward pass only"),
    (tp_ok, lambda n: 1.5 * n, link_ok, "bf16 bytes"),
    (tp_ok, lambda n: 1.5 * n, link_ok, "3P FLOPs per token instead of 6P"),
    (lambda h: 1 / h, dp_ok, link_ok, "inverted"),
    (lambda h: 9 * h / 14, dp_ok, link_ok, "constants kept"),
    (tp_ok, dp_ok, lambda f, b: b / f, "inverted"),
    (tp_ok, dp_ok, lambda f, b: f / (b / 1e9), "off by 1e9"),
    (tp_ok, dp_ok, lambda f, b: f / (b / 2), "use bytes_per_s as given"),
    (tp_ok, dp_ok, lambda f, b: str(f / b), "expected a number"),
], ids=["tp-squared", "dp-6n", "dp-n", "dp-bytes", "dp-3p", "tp-inverted", "tp-constants",
         "link-inverted", "link-units", "link-halved", "str"])
def test_wrong_intensities_are_caught(tp, dp, link, needle):
    with pytest.raises(CheckFailed) as info:
        check_intensities(tp, dp, link, quiet=True)
    assert needle in str(info.value)


def _placement_inverted(h, n_tokens, flops_per_s, bytes_per_s):
    out = placement_ok(h, n_tokens, flops_per_s, bytes_per_s)
    return {k: {"compute_bound": v["compute_bound"], "headroom": 1 / v["headroom"]}
            for k, v in out.items()}


def _placement_strict_flag(h, n_tokens, flops_per_s, bytes_per_s):
    out = placement_ok(h, n_tokens, flops_per_s, bytes_per_s)
    return {k: {"compute_bound": v["headroom"] < 1, "headroom": v["headroom"]}
            for k, v in out.items()}


@pytest.mark.parametrize("fn,needle", [
    (_placement_inverted, "inverted"),
    (_placement_strict_flag, "a bool, True when headroom >= 1"),
    (lambda h, n_tokens, flops_per_s, bytes_per_s: (1.0, 2.0), "return a dict shaped like"),
])
def test_wrong_placement_is_caught(fn, needle):
    with pytest.raises(CheckFailed) as info:
        check_placement(fn, quiet=True)
    assert needle in str(info.value)


def test_interconnect_reexport_is_rejected():
    with pytest.raises(CheckFailed, match="course's own"):
        check_intensities(costs.tp_flops_per_byte, dp_ok, link_ok, quiet=True)


# --- figures ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", figures.KINDS)
@pytest.mark.parametrize("t", [2, 4])
def test_every_collective_has_a_titled_figure(kind, t):
    fig = figures.draw_collective(kind, t=t)
    assert isinstance(fig, matplotlib.figure.Figure)
    assert fig.get_suptitle()
    assert [ax.get_title() for ax in fig.axes[:2]] == ["before", "after"]
    matplotlib.pyplot.close(fig)


def test_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="all_reduce"):
        figures.draw_collective("allreduce")


def test_ring_and_time_figures_are_titled():
    fig = figures.draw_ring_allreduce(t=4)
    assert fig.get_suptitle() and len(fig.axes) == 2 * 4  # ring + start + 2(t-1) steps
    matplotlib.pyplot.close(fig)
    fig = figures.plot_allreduce_time([1e6, 1e9], alpha=5e-6, bandwidth=50e9)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    matplotlib.pyplot.close(fig)


NOTEBOOK_PX = 1000  # JupyterLab shows a figure up to about this many pixels wide, else shrinks it


def _smallest_label_px(fig) -> float:
    """The smallest text of a figure in screen pixels, once a notebook has shrunk it to fit."""
    width_px = fig.get_figwidth() * fig.dpi
    shrink = min(1.0, NOTEBOOK_PX / width_px)
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
    return min(sizes) * fig.dpi / 72 * shrink


@pytest.mark.parametrize("t", [2, 3, 4])
def test_ring_figure_labels_are_readable_in_a_notebook(t):
    # the old layout, one row of 2t panels 16.8 in wide in 8 pt, showed its labels at 6 px
    fig = figures.draw_ring_allreduce(t=t)
    fig.set_dpi(100)
    assert _smallest_label_px(fig) >= 10
    labels = {x.get_text() for x in fig.findobj(matplotlib.text.Text)}
    assert "Σ" in labels and "rank 0" in labels and "all-gather\nstep 1" in labels
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("kind", figures.KINDS)
def test_collective_figure_labels_are_readable_in_a_notebook(kind):
    fig = figures.draw_collective(kind, t=4)
    fig.set_dpi(100)
    assert _smallest_label_px(fig) >= 10
    matplotlib.pyplot.close(fig)
