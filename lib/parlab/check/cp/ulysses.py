r"""Exercise 5 of module 05, `check_ulysses(seq_to_heads, heads_to_seq)`: Ulysses' reshuffles.

On world_size = W ranks, each holding N = 5 tokens (T = 5W) of H = 12 heads of size D = 4,
batch 2, float64 (sizes no answer can special-case: 5 tokens, 12/W heads per rank):
1. `seq_to_heads(x)` on rank r's (B, H, 5, D) tokens must return (B, H/W, T, D): every token,
   rank 0's first, of heads r H/W .. (r+1) H/W - 1; `heads_to_seq` the inverse; both exact.
2. Each is one all-to-all (`dist.all_to_all_single`, or the list `dist.all_to_all` with
   equal parts): anything else is stopped before it is made, and the bytes it sends must be
   (W - 1)/W of the tensor, measured by `parlab.comm`. Inputs unchanged after the call.
3. Attention built from them, forward and backward: q, k, v (k and v with W key/value heads,
   one per rank: grouped-query) go to head shards through the learner's `seq_to_heads`,
   attend over the whole sequence (the check's own float64 softmax attention, causal and
   not), the output comes back through `heads_to_seq`; the backward sends the output's
   gradient through `seq_to_heads` and dq, dk, dv back through `heads_to_seq`. Outputs and
   gradients against full attention on one device by autograd (rtol 1e-10).
parlab's own `seq_to_heads`, `heads_to_seq` and Ulysses layer are refused while the
learner's code runs. The check stands on its own: it uses no earlier exercise.

A right answer must not depend on W (2, 3 and 4 visible, 6 hidden: 2 heads per rank) or on
the head count (12 for q, W for k and v: read H from the input). The batch (2), the tokens
per rank (5, never W) and the head size (4) are fixed; they are read from the input's shape,
and a batch of 2 shows a reshape that takes the rank blocks for the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from parlab.check._compare import assert_close, assert_unchanged, fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, not_reexport, run_checked
from parlab.check.cp.common import reference
from parlab.check.cp.ranks import cpu, env
from parlab.cp import ulysses

__all__ = ["check_ulysses", "SIZES", "REFUSED"]

B, H, N, D = 2, 12, 5, 4  # batch, heads, tokens per rank, head size
SIZES = {"batch": B, "heads": H, "tokens_per_rank": N, "head_dim": D}
REFUSED = [ulysses.seq_to_heads, ulysses.heads_to_seq, ulysses.ulysses_attention_forward,
           ulysses.UlyssesAttention]
REFUSAL = "parlab.cp.seq_to_heads / heads_to_seq / ulysses_attention"
A2A = ("all_to_all_single", "all_to_all")
ONE_A2A = ("each reshuffle is ONE all-to-all: make a (W, ...) tensor whose block j is what "
           "rank j needs, send = x.reshape(B, W, H // W, n, D).transpose(0, 1).contiguous(), "
           "recv = torch.empty_like(send), dist.all_to_all_single(recv, send)")
BUFFERS = ("dist.all_to_all_single(output, input) needs an output of the input's size and "
           "dtype, both contiguous: recv = torch.empty_like(send) after send = ....contiguous()")
HEADS = ("rank r must end with heads r*H/W .. (r+1)*H/W - 1, a contiguous block (block j of "
         "the heads goes to rank j), with every token, rank 0's first")


def _guard(rank: int, where: str) -> Callable[[str, Any], None]:
    """A parlab.comm listener: only all-to-alls, each checked before it is made."""
    def hear(phase: str, event: Any) -> None:
        if phase != "start" or event.kind.startswith("wait("):
            return
        if event.kind not in A2A:
            fail(f"{where} called dist.{event.kind}; Ulysses moves each rank's share with an "
                 "all-to-all, (W - 1)/W of the tensor" + (
                     ", where an all-gather would send every rank the whole of it"
                     if "gather" in event.kind else ""), rank=rank, hint=ONE_A2A)
    return hear


def _call(fn: Callable, x: Tensor, name: str, rank: int, *, shape_hint: str = ONE_A2A
          ) -> tuple[Any, list[float]]:
    """Call a reshuffle under the guard; return its result and the bytes of each call."""
    from parlab import comm

    kept, where = cpu(x), f"{name} on a {tuple(x.shape)} tensor"
    with comm.trace() as tr:
        comm.add_listener(hear := _guard(rank, where))
        try:
            got = call_learner(where, fn, x, refuse=REFUSED, refusal=REFUSAL,
                               shape_hint=shape_hint)
        finally:
            comm.remove_listener(hear)
    assert_unchanged(kept, x, name=f"the input of {name}", rank=rank,
                     hint="leave the input as it is: reshape, permute and .contiguous() make "
                          "new tensors; receive into a new buffer")
    return got, [e.wire_bytes for e in tr.events if e.kind in A2A]


def _reshuffle_worker(fn_s: Callable, fn_h: Callable) -> dict:
    rank, world, dev = env()
    x = _tensor(world, 1).to(dev)
    mine = x[..., rank * N:(rank + 1) * N, :].contiguous()  # (B, H, N, D)
    heads = x[:, rank * H // world:(rank + 1) * H // world].contiguous()  # (B, H/W, T, D)
    try:
        s_out, s_bytes = _call(fn_s, mine, "seq_to_heads", rank)
        _early_shape(s_out, heads, world, "seq_to_heads", rank)
        h_out, h_bytes = _call(fn_h, heads, "heads_to_seq", rank)
        _early_shape(h_out, mine, world, "heads_to_seq", rank)
    except Exception as exc:
        _buffer_hint(exc, rank)
        raise
    return {"seq_to_heads": cpu(s_out), "heads_to_seq": cpu(h_out), "bytes": (s_bytes, h_bytes),
            "sent": (mine.numel() * 8, heads.numel() * 8)}


_GLOO_BUFFERS = ("raised ValueError: Invalid usage of tensors with different dtypes",
                 "in->size == out->size", "Tensors must be contiguous")


def _early_shape(got: Any, want: Tensor, world: int, name: str, rank: int) -> None:
    """In the rank, before anything else runs on a wrong shape: what was expected."""
    if not isinstance(got, Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        fail(f"{name} on {world} ranks returned {shape}, expected {tuple(want.shape)}",
             rank=rank, hint=_shape_hint(got, tuple(want.shape), world, name))


def _buffer_hint(exc: Exception, rank: int) -> None:
    text = str(exc)
    if any(s in text for s in _GLOO_BUFFERS):
        fail(f"all_to_all_single refused its buffers: {text.splitlines()[0][:160]}",
             rank=rank, hint=BUFFERS)


def _tensor(world: int, seed: int, heads: int = H) -> Tensor:
    gen = torch.Generator().manual_seed(500 + 10 * world + seed)
    return torch.randn(B, heads, world * N, D, generator=gen, dtype=torch.float64)


def _shape_hint(got: Any, want: tuple[int, ...], world: int, name: str) -> str:
    shape = tuple(got.shape) if isinstance(got, Tensor) else None
    for other in (2, 3, 4):
        as_if = ((B, H // other, other * N, D) if name == "seq_to_heads" else
                 (B, other * (H // world), world * N // other, D))
        if other != world and shape == as_if:
            return (f"those are the shapes of {other} ranks, not {world}: read W from "
                    "dist.get_world_size(), never a number")
    if shape == (B, H, world * N, D // world) or shape == (B, H, N, D * world):
        return ("the all-to-all split the head size D (dimension 3), not the heads: a head's "
                "scores need all D of its features, so split dimension 1 (the heads) into W "
                "blocks")
    if shape is not None and len(shape) == 4 and shape[2] == (N if name == "seq_to_heads"
                                                             else world * N):
        return "the sequence dimension did not change: the all-to-all exchanged nothing useful"
    return (f"{name} returns (B, H/W, T, D) = {want}" if name == "seq_to_heads" else
            f"{name} returns (B, H, T/W, D) = {want}") + f"; {HEADS}"


def _value_hint(got: Tensor, x: Tensor, rank: int, world: int, name: str) -> str:
    hc = H // world
    if name == "seq_to_heads":
        strided = x[:, rank::world]
        tokens = x[:, rank * hc:(rank + 1) * hc].reshape(B, hc, world, N, D).transpose(2, 3)
        if got.shape == strided.shape and torch.equal(got, strided):
            return ("your rank r got heads r, r + W, r + 2W, ...: reshape the heads as (W, "
                    "H/W), block first, (B, W, H // W, n, D), so that block j is heads "
                    "j*H/W .. (j+1)*H/W - 1")
        if torch.equal(got, tokens.reshape(B, hc, world * N, D)):
            return ("the right heads, but the tokens interleaved: the received blocks are "
                    "(W, B, H/W, n, D), rank i's n tokens in block i; put W before n, "
                    ".permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, D)")
        return HEADS
    strided = x[..., rank::world, :]
    if got.shape == strided.shape and torch.equal(got, strided):
        return ("your rank r got tokens r, r + W, ...: rank r's tokens are the contiguous "
                "block r*n .. (r+1)*n - 1 of the sequence")
    heads = x[..., rank * N:(rank + 1) * N, :].reshape(B, world, hc, N, D).transpose(1, 2)
    if torch.equal(got, heads.reshape(B, H, N, D)):
        return ("the heads come back interleaved: block i received from rank i holds heads "
                "i*H/W .. (i+1)*H/W - 1; put the block index before the head index, "
                "(W, B, H/W, n, D) -> (B, W, H/W, n, D) -> (B, H, n, D)")
    return "heads_to_seq is the exact inverse of seq_to_heads: " + HEADS


def _check_reshuffles(results: list[dict], world: int) -> None:
    x = _tensor(world, 1)
    hc = H // world
    for rank, res in enumerate(results):
        for name, want in (("seq_to_heads", x[:, rank * hc:(rank + 1) * hc]),
                           ("heads_to_seq", x[..., rank * N:(rank + 1) * N, :])):
            got = res[name]
            label = f"{name} on {world} ranks"
            if not isinstance(got, Tensor) or got.shape != want.shape:
                assert_close(got, want, name=label, rank=rank,
                             hint=_shape_hint(got, tuple(want.shape), world, name))
            if not torch.equal(got.double(), want):
                assert_close(got, want, name=label, rank=rank, rtol=0, atol=0,
                             hint=_value_hint(got.double(), x, rank, world, name))
        for name, sent, total in zip(("seq_to_heads", "heads_to_seq"), res["bytes"],
                                     res["sent"], strict=True):
            if len(sent) != 1 or abs(sent[0] - (world - 1) / world * total) > 0.5:
                fail(f"{name} made {len(sent)} all-to-all calls sending {sum(sent):g} bytes; "
                     f"one all-to-all of its {total}-byte input sends (W - 1)/W of it, "
                     f"{(world - 1) / world * total:g}", rank=rank, hint=ONE_A2A)


def _attention_worker(fn_s: Callable, fn_h: Callable) -> list[dict]:
    return [_attention(fn_s, fn_h, causal) for causal in (False, True)]


def _attention(fn_s: Callable, fn_h: Callable, causal: bool) -> dict:
    rank, world, dev = env()
    q, k, v, dout = (_tensor(world, i, heads=H if i in (2, 5) else world).to(dev)
                     for i in (2, 3, 4, 5))
    pos = torch.arange(world * N, device=dev)
    rows = slice(rank * N, (rank + 1) * N)
    mine = [x[..., rows, :].contiguous() for x in (q, k, v, dout)]
    fewer = (f"k and v have {world} heads here (grouped-query attention), fewer than q's {H}: "
             "read H from x.shape[1], and split whatever heads the tensor has")
    with torch.no_grad():
        qh = _call(fn_s, mine[0], "seq_to_heads", rank)[0]
        kh, vh = (_call(fn_s, x, "seq_to_heads", rank, shape_hint=fewer)[0] for x in mine[1:3])
    leaves = [t.detach().clone().requires_grad_() for t in (qh, kh, vh)]
    g = qh.shape[1] // max(1, kh.shape[1])
    out_h = reference(leaves[0], leaves[1].repeat_interleave(g, 1),
                      leaves[2].repeat_interleave(g, 1), pos, pos, causal)[0]
    out = _call(fn_h, out_h.detach().contiguous(), "heads_to_seq", rank)[0]
    dout_h = _call(fn_s, mine[3], "seq_to_heads", rank)[0]
    out_h.backward(dout_h)
    grads = [_call(fn_h, t.grad.contiguous(), "heads_to_seq", rank)[0] for t in leaves]
    return {"out": cpu(out), "grads": [cpu(t) for t in grads]}


def _check_attention(results: list[dict], world: int, causal: bool) -> None:
    q, k, v, dout = (_tensor(world, i, heads=H if i in (2, 5) else world) for i in (2, 3, 4, 5))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    g, pos = H // world, torch.arange(world * N)
    out = reference(leaves[0], leaves[1].repeat_interleave(g, 1),
                    leaves[2].repeat_interleave(g, 1), pos, pos, causal)[0]
    out.backward(dout)
    what = f"Ulysses attention from your reshuffles ({'causal' if causal else 'not causal'}, "
    what += f"{world} key/value heads on {world} ranks)"
    for rank, res in enumerate(results):
        rows = slice(rank * N, (rank + 1) * N)
        assert_close(res["out"], out.detach()[..., rows, :], name=f"{what}: output", rank=rank,
                     rtol=1e-10, atol=1e-12, hint="the reshuffles pass on their own; check "
                     "that neither keeps state between calls")
        for name, got, leaf in zip(("dq", "dk", "dv"), res["grads"], leaves, strict=True):
            assert leaf.grad is not None, "autograd reached every input of the reference"
            assert_close(got, leaf.grad[..., rows, :], name=f"{what}: {name}", rank=rank,
                         rtol=1e-10, atol=1e-12, hint="k and v have fewer heads than q "
                         "(W, one per rank): your reshuffles must work for any head count "
                         "divisible by W, read H from x.shape[1]")


@exercise("05.ulysses")
def check_ulysses(seq_to_heads: Callable, heads_to_seq: Callable, *, world_size: int = 2,
                  timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 5: the two reshuffles on `world_size` ranks, then attention built from them,
    outputs and gradients (module docstring)."""
    not_reexport(seq_to_heads, name="seq_to_heads")
    not_reexport(heads_to_seq, name="heads_to_seq")
    hang = ("every rank must call the all-to-all, the same number of times, with tensors of "
            "the same size: a rank that skips it (an `if rank == ...`) leaves the others "
            "waiting")
    results = run_checked(_reshuffle_worker, world_size, seq_to_heads, heads_to_seq,
                          what="seq_to_heads and heads_to_seq", timeout=timeout, hang_hint=hang)
    _check_reshuffles(results, world_size)
    results = run_checked(_attention_worker, world_size, seq_to_heads, heads_to_seq,
                          what="attention built from your reshuffles", timeout=timeout,
                          hang_hint=hang)
    for i, causal in enumerate((False, True)):
        _check_attention([res[i] for res in results], world_size, causal)
    if not quiet:
        sent = (world_size - 1) / world_size * B * H * N * D * 8
        print(f"Ulysses OK on {world_size} ranks ({world_size * N} tokens, {H} heads, "
              f"{H // world_size} per rank): both reshuffles exact, one all-to-all each "
              f"sending (W - 1)/W of a rank's tensor ({sent:g} bytes for q); attention from "
              "them matches full attention, forward and backward, causal and not, with "
              f"{world_size} key/value heads")
