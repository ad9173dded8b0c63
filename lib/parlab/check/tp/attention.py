r"""Module 02, exercise 5: attention split by heads.

Reference: parlab.model.Attention(48, 12) (causal, head size 4) with every parameter
randomised, in float32 (rtol=1e-5, atol=1e-4): the output, the input gradient and the
gradients of this rank's rows of qkv ([Q_r; K_r; V_r]) and columns of proj. Twelve heads make
t = 2, 3 and 4 all valid (6, 4 and 3 heads per rank), so an answer that hard-codes the head
count, or the heads per rank, of the notebook's example fails. `hidden=`, `heads=` and
`causal=` set another attention (the visible test's second call: Attention(40, 10) without the
causal mask), so an answer that writes C = 48 in instead of reading attn.qkv.in_features, or
causal=True instead of attn.causal, fails. An attention of t + 1 heads on t ranks must be
refused with a ValueError that names the heads.

A right answer does not depend on, and the tests vary: the world size (visible 2, hidden 3
and 4), the width and head count (48/12 and 40/10), the causal mask (on and off), the
weights and biases (random), the upstream gradient (random).
"""

from __future__ import annotations

import copy

import torch

from parlab.check._compare import fail
from parlab.check._harness import CHECK_TIMEOUT_S, exercise, run_checked
from parlab.check.tp import hints
from parlab.check.tp.common import (
    EXACT,
    F32_TOL,
    HEADS,
    SEED,
    H,
    cpu,
    handed,
    learner_mode,
    prepare,
    run_module,
)
from parlab.check.tp.compare import (
    bias_counted,
    close,
    compare,
    expect_events,
    got,
    part,
    reject_reference,
)
from parlab.check.tp.keys import KEY_ATTENTION, LINEARS
from parlab.model.transformer import Attention

__all__ = ["check_tp_attention"]
PARAMS = ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")
QKV_LAYOUT = ("attn.qkv's rows are [Q; K; V] (each C rows, head h at rows h*d:(h+1)*d): a "
              "contiguous block of 3C/t rows is not one rank's heads. Rank r needs the Q, K and "
              "V rows of its heads, stacked as [Q_r; K_r; V_r]")
CAUSAL = ("the mask comes from the attention given: causal=self.causal (attn.causal), not a "
          "fixed True or False: this check's attention is {}")
SIZES_FROM_ATTN = ("take every size from attn (C = attn.qkv.in_features, n_heads = attn.n_heads) "
                   "and t from dist.get_world_size(): this check's attention is not the "
                   "notebook's 48 features and 12 heads")


def _divisibility(cls: type, t: int, dev: torch.device, rank: int) -> None:
    """TPAttention must refuse t+1 heads on t ranks with a ValueError that names the heads."""
    heads = t + 1
    bad = Attention(4 * heads, heads).to(dev)
    stage = f"{cls.__name__}(attention with {heads} heads, hidden {4 * heads}) on {t} ranks"
    hint = (f"raise ValueError(f\"n_heads = {heads} is not divisible by t = {t}; ...\") in "
            "__init__, saying what to change: TP gives every rank whole heads")
    try:
        cls(bad)
    except (NotImplementedError, AssertionError):
        raise
    except ValueError as exc:
        if "head" not in str(exc).lower():
            fail(f"{stage} raised ValueError({str(exc)!r}), which does not mention the heads",
                 rank=rank, hint=hint)
        return
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{stage} raised {type(exc).__name__}: {exc}", rank=rank, hint=hint)
    fail(f"{stage} was accepted", rank=rank, hint=hint)


def _other_head_counts(attn: Attention, x: torch.Tensor, t: int, hidden: int,
                       heads: int) -> dict[int, torch.Tensor]:
    """The single-device output with n heads in all, for every n other than `heads` that t
    divides and that divides `hidden`: what an answer with the wrong heads per rank computes."""
    out = {}
    for n in range(t, hidden + 1, t):
        if hidden % n == 0 and n != heads:
            other = copy.deepcopy(attn)
            other.n_heads = n
            with torch.no_grad():
                out[n] = cpu(other(x))
    return out


def _attention_worker(cls: type, seed: int, hidden: int, heads: int, causal: bool) -> dict:
    rank, t, dev, attn, x, up, ref = prepare(lambda: Attention(hidden, heads, causal=causal),
                                             seed, hidden=hidden)
    if not learner_mode():
        ref["heads"] = _other_head_counts(attn, x, t, hidden, heads)
        flipped = copy.deepcopy(attn)
        flipped.causal = not causal
        with torch.no_grad():
            ref["flipped"] = cpu(flipped(x))  # what an answer with the other mask computes
    # at other sizes than the notebook's, a crash the default sizes did not cause is likely a
    # size written in
    other = (hidden, heads) != (H, HEADS)
    out = run_module(cls, handed(attn, {"qkv": "heads", "proj": "row"}, rank, t), x, up, rank,
                     PARAMS, shape_hint=(lambda _: SIZES_FROM_ATTN) if other else None,
                     build_hint=SIZES_FROM_ATTN if other else None)
    _divisibility(cls, t, dev, rank)
    return {"ref": ref, **out}


def _qkv_rows(rank: int, t: int, hidden: int) -> torch.Tensor:
    """Rows of the fused [Q; K; V] weight that hold rank's heads, in [Q_r; K_r; V_r] order."""
    c = hidden // t
    return torch.cat([torch.arange(j * hidden + rank * c, j * hidden + (rank + 1) * c)
                      for j in range(3)])


def _shard(r: dict, p: str, t: int, hidden: int) -> torch.Tensor:
    c = hidden // t
    full = r["ref"][p]
    if p.startswith("qkv"):
        return full[_qkv_rows(r["rank"], t, hidden)]
    return full[:, r["rank"] * c:(r["rank"] + 1) * c] if p.startswith("proj.weight") else full


def _check_output(results: list[dict], t: int, hidden: int, heads: int, causal: bool) -> None:
    c = hidden // t
    for rank, r in enumerate(results):
        w = r["qkv.weight"]
        if w.shape == (3 * c, hidden) and torch.equal(w, r["ref"]["qkv.weight"][rank * 3 * c:
                                                                         (rank + 1) * 3 * c]):
            fail("qkv.weight holds a contiguous block of rows of attn.qkv.weight", rank=rank,
                 hint=QKV_LAYOUT)
        if bias_counted(r["y"], r["ref"]["y"], r["ref"]["proj.bias"], t):
            fail(f"the output is off by (t - 1) x proj.bias = {t - 1} x proj.bias", rank=rank,
                 hint=hints.BIAS_ONCE)
    def shard(r: dict, key: str) -> torch.Tensor:
        return _shard(r, key, t, hidden)

    for p in PARAMS:  # the shards first: a wrong one explains a wrong output
        compare(results, t, [(p, got(p), part(shard, p))], EXACT,
                hint=QKV_LAYOUT if p.startswith("qkv") else
                "proj is row-parallel: rank r keeps columns r*C/t:(r+1)*C/t of its weight")
    for rank, r in enumerate(results):
        if close(r["y"], r["ref"]["flipped"], **F32_TOL):
            fail(f"the output is that of attention {'without' if causal else 'with'} the "
                 f"causal mask", rank=rank, hint=CAUSAL.format(
                     "causal" if causal else "not causal (attn.causal is False)"))
        n = next((n for n, y in r["ref"]["heads"].items() if close(r["y"], y, **F32_TOL)), None)
        if n is not None and not close(r["y"], r["ref"]["y"], **F32_TOL):
            fail(f"the output is that of attention with {n // t} heads per rank ({n} in all) "
                 f"instead of n_heads / t = {heads // t}", rank=rank,
                 hint="take the number of heads from attn.n_heads and divide it by t = "
                      "dist.get_world_size(); do not write the example's numbers in")
    compare(results, t, [("output", lambda r: r["y"], lambda r: r["ref"]["y"])], F32_TOL,
            hint="the shards are right, so look at forward: split qkv's output into q, k, v "
                 "(C/t each), run attention over n_heads/t heads, then proj")


@exercise(KEY_ATTENTION, needs=LINEARS)
def check_tp_attention(cls: type, *, world_size: int = 2, seed: int = SEED, hidden: int = H,
                       heads: int = HEADS, causal: bool = True,
                       timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """TPAttention(attn) against parlab.model.Attention (`heads` heads, C = `hidden`, the
    causal mask if `causal`; 12, 48 and causal by default): output, grad of x, of qkv (rows
    [Q_r; K_r; V_r]) and proj; ValueError for t+1 heads. t must divide the heads, and the
    heads C."""
    reject_reference(cls, "TPAttention")
    t = world_size
    if heads % t or hidden % heads:
        raise ValueError(f"hidden={hidden}, heads={heads}: t = {t} must divide the heads and "
                         "the heads the hidden size")
    results = run_checked(_attention_worker, t, cls, seed, hidden, heads, causal,
                          what="TPAttention", timeout=timeout, hang_hint=hints.HANG)
    _check_output(results, t, hidden, heads, causal)
    expect_events(results, "forward", "TPAttention", ["all_reduce"], lambda ev: (
        "attention needs one all-reduce in forward, g, in the row-parallel output projection"))
    compare(results, t, [(f"grad of {p}", got(p + ".grad"),
                          part(lambda r, key: _shard(r, key, t, hidden), p + ".grad"))
                         for p in PARAMS],
            F32_TOL, hint=hints.GRAD_HINT)
    compare(results, t, [("grad of x (the attention's input)", lambda r: r["x.grad"],
                          lambda r: r["ref"]["x.grad"])], F32_TOL, t_times=hints.EXTRA_F,
            hint=hints.GRAD_HINT)
    expect_events(results, "backward", "TPAttention", ["all_reduce"], lambda ev: (
        hints.F_BACKWARD if not ev else
        f"{len(ev)} all-reduces in backward: apply f once, to x, before one fused qkv "
        "column-parallel projection (three separate f's all-reduce three times)"
        if len(ev) == 3 else hints.G_BACKWARD))
    if not quiet:
        print(f"TPAttention OK on {t} ranks ({heads // t} of {heads} heads per rank, C = "
              f"{hidden}, {'causal' if causal else 'no causal mask'}): output "
              "and the gradients of x, qkv and proj match single-device attention (float32, "
              f"rtol={F32_TOL['rtol']:g}, atol={F32_TOL['atol']:g}); {t + 1} heads rejected "
              "with a ValueError")
