r"""Module 08, exercise 2: selective and full activation recomputation, measured.

`recompute_forward(layer, x, recompute)`: the forward of a `parlab.model.recompute.
RecomputeLayer` (used only as the holder of its weights; its own forward is refused while the
answer runs) with nothing recomputed, the attention core checkpointed ("selective"), or the
whole layer checkpointed ("full"). `saved_bytes_formula(b, s, h, a, recompute)`: the bytes
one layer keeps for backward.

Compared with, all computed here on a layer whose every parameter is randomised (LayerNorms
included), x of shape (B, S, C) = (2, 20, 24), 3 heads (as/h = 2.5, so the scores' term is
neither negligible nor equal to another one), dropout p = 0.1:

- outputs and gradients (x's and every weight's) equal to the same layer run by parlab's own
  forward without recomputation, the same dropout masks drawn from the same seed (float32,
  exact up to 1e-6: the same operations in the same order), with the layer in training mode
  and in eval mode;
- the bytes autograd keeps, measured by this check's own meter (each storage once,
  parameters excluded, bf16 activations, bool masks), equal to Korthikanti et al.'s table plus
  the LayerNorm statistics: none $34sbh + 5as^2b + 8sb$, selective $34sbh + 8sb$, full $2sbh$;
- the FLOPs of forward and backward (PyTorch's FlopCounterMode), $3F$ plus what recomputation
  adds: selective $2bs^2h$ (the scores GEMM), full one forward $F$, with
  $F = 24bsh^2 + 4bs^2h$. The exercise asks for use_reentrant=False: a checkpoint without it
  warns (torch) and the reentrant one recomputes $4bs^2h$; both fail with that named;
- `saved_bytes_formula` against the same closed form at sizes where the wrong forms differ
  (`recompute_formula`), with parlab.costs.activations and parlab.model.recompute's counters
  refused.

What a right answer must not depend on, and how the tests vary it:

- the sizes and the head count: `shape=` and `heads=` (visible: (2, 20, 24) with 3 heads and
  (3, 10, 24) with 4, where an answer that writes a = 3 in still runs, and is named by its
  output, that of the layer with 3 heads);
- the dropout probability: `p_drop=` (visible: 0.1 and 0.25; hidden: (1, 12, 30) with 5
  heads at 0.5; an output equal to the one with 0.1 is named);
- the layer's mode: every call runs the three policies with the layer in training mode and
  in eval mode, where dropout is the identity and the recomputed forward must agree (an
  output that dropped out in eval mode, `training=True` written in, is named);
- the formula's arguments: five sizes visible, four more hidden.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from parlab.check._compare import assert_close, expect_type, fail, randomize_parameters
from parlab.check._harness import call_learner, exercise, not_reexport, on_learner_side
from parlab.check.whole.common import KEY_RECOMPUTE
from parlab.check.whole.recompute_formula import (
    HIDDEN_POINTS,
    POINTS,
    POLICIES,
    check_formula,
    closed_form,
)

B, S, H, A = 2, 20, 24, 3
Dims = tuple[int, int, int, int]  # (b, s, h, a): batch, sequence, hidden, heads
Mode = tuple[float, bool]  # (p_drop, training): the layer's dropout and mode
P_DROP, SEED, MASK_SEED = 0.1, 2205, 7
REFUSAL = "parlab's RecomputeLayer forward or its activation counters (parlab.costs.activations)"
SIZES = ("take every size from the arguments: b, s, h = x.shape and a = layer.n_heads, never "
         "a number written in: this check's layer has {a} heads and x is {shape}")
EVAL = ("in eval mode (layer.training is False) dropout is the identity, and your forward "
        "dropped out anyway: pass layer.training to attention_core and to every dropout, not "
        "True")
FIXED_P = ("your forward dropped out with p = {fixed}, the first test's, where this layer has "
           "layer.p_drop = {p}: read the probability from the layer, never a number written in")


def layer_forward_flops(b: int, s: int, h: int) -> int:
    return 24 * b * s * h * h + 4 * b * s * s * h


class _Meter:
    """What autograd saves while open: each storage once, `skip` excluded (this check's own,
    independent of parlab.costs.activations)."""

    def __init__(self, skip: tuple[Tensor, ...]) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in skip}
        self.kept: dict[int, Any] = {}

    def pack(self, t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.nbytes() and st.data_ptr() not in self.skip:
            self.kept.setdefault(st.data_ptr(), st)
        return t

    def measure(self, fn: Callable[[], Any]) -> int:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            fn()
        return sum(st.nbytes() for st in self.kept.values())


def _layers(dtype: torch.dtype, dims: Dims, mode: Mode = (P_DROP, True)
            ) -> tuple[nn.Module, Tensor]:
    from parlab.model.recompute import RecomputeLayer

    b, s, h, a = dims
    torch.manual_seed(SEED)
    layer = RecomputeLayer(h, a, p_drop=mode[0], recompute="none").train(mode[1])
    randomize_parameters(layer, seed=SEED)
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(SEED + 1))
    return layer.to(dtype), x.to(dtype).requires_grad_()


def _run(forward: Callable[[nn.Module, Tensor], Tensor], dtype: torch.dtype, dims: Dims,
         mode: Mode = (P_DROP, True)) -> tuple[Tensor, list[Tensor]]:
    layer, x = _layers(dtype, dims, mode)
    torch.manual_seed(MASK_SEED)  # the dropout masks
    out = forward(layer, x)
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(SEED + 2), dtype=dtype)
    (out * up).sum().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters()]
    return out.detach(), [g if g is not None else torch.zeros(()) for g in grads]


def _refused() -> list[Any]:
    from parlab.costs import activations, memory
    from parlab.model import recompute

    return [recompute.RecomputeLayer, recompute.saved_activation_bytes,
            recompute.recompute_flops, recompute.layer_flops, activations.SavedTensorMeter,
            activations.saved_tensor_bytes, activations.activation_breakdown,
            activations.activation_bytes_per_layer, memory.activation_bytes]


REENTRANT = ("torch.utils.checkpoint without use_reentrant=False: the reentrant variant (the "
             "default) reruns the checkpointed function through its own backward and warns "
             "that the argument must be passed; write checkpoint(attention_core, q, k, v, "
             "p_drop, training, use_reentrant=False)")


def _learner(fn: Callable[..., Any], policy: str,
             dims: Dims) -> Callable[[nn.Module, Tensor], Tensor]:
    call = f"recompute_forward(layer, x, {policy!r})"
    b, s, h, a = dims
    # at other sizes than the visible test's, a crash is most likely a size written in
    sizes = None if tuple(dims) == (B, S, H, A) else SIZES.format(a=a, shape=f"({b}, {s}, {h})")

    def forward(layer: nn.Module, x: Tensor) -> Tensor:
        with warnings.catch_warnings(record=True) as caught:  # torch's, not shown as they are
            warnings.simplefilter("always")
            out = call_learner(call, fn, layer, x, policy, refuse=_refused(), refusal=REFUSAL,
                               hint=sizes, shape_hint="x is (B, s, C); q, k and v are (B, a, "
                                                      "s, C/a), contiguous")
        if any("use_reentrant" in str(w.message) for w in caught):
            fail(f"{call} calls checkpoint without use_reentrant", hint=REENTRANT)
        return out
    return forward


# The learner's side of each measurement (on_learner_side: in the learner's process under the
# verifier); each returns plain data, compared here.

def _learner_run(fn: Callable[..., Any], policy: str, dims: Dims,
                 mode: Mode) -> tuple[Tensor, list[Tensor]]:
    return _run(_learner(fn, policy, dims), torch.float32, dims, mode)


def _learner_bytes(fn: Callable[..., Any], policy: str, dims: Dims, p_drop: float) -> int:
    layer, x = _layers(torch.bfloat16, dims, (p_drop, True))
    forward = _learner(fn, policy, dims)
    return _Meter(tuple(layer.parameters())).measure(lambda: forward(layer, x))


def _learner_flops(fn: Callable[..., Any], policy: str, dims: Dims, p_drop: float) -> int:
    layer, x = _layers(torch.float32, dims, (p_drop, True))
    forward = _learner(fn, policy, dims)
    with FlopCounterMode(display=False) as counter:
        forward(layer, x).sum().backward()
    return int(counter.get_total_flops())


def _with_heads(a: int) -> Callable[[nn.Module, Tensor], Tensor]:
    """The reference forward with `a` heads instead of the layer's: an answer's a written in."""
    def forward(layer: nn.Module, x: Tensor) -> Tensor:
        setattr(layer, "n_heads", a)  # noqa: B010 - a Module attribute that is an int
        return layer(x)
    return forward


def _same(out: Any, forward: Callable[[nn.Module, Tensor], Tensor], dims: Dims,
          mode: Mode) -> bool:
    """`out` is what `forward` (a reference forward, wrong on purpose) computes."""
    want = _run(forward, torch.float32, dims, mode)[0]
    return isinstance(out, Tensor) and out.shape == want.shape and torch.allclose(
        out, want, rtol=1e-6, atol=1e-6)


def _check_values(fn: Callable[..., Any], policy: str, dims: Dims, mode: Mode) -> None:
    """Output and gradients in `mode` (p_drop, training) against the layer's own forward; an
    output equal to the forward with another head count, dropout in eval mode or the first
    test's p_drop is named."""
    ref_out, ref_grads = _run(lambda layer, x: layer(x), torch.float32, dims, mode)
    out, grads = on_learner_side(_learner_run, fn, policy, dims, mode)
    b, s, h, a = dims
    call = f"recompute_forward(layer, x, {policy!r})"
    if not (isinstance(out, Tensor) and out.shape == ref_out.shape
            and torch.allclose(out, ref_out, rtol=1e-6, atol=1e-6)):
        if a != A and h % A == 0 and _same(out, _with_heads(A), dims, mode):
            fail(f"{call} computed attention with {A} heads; the layer has layer.n_heads = "
                 f"{a}", hint=SIZES.format(a=a, shape=(b, s, h)))
        if not mode[1] and _same(out, lambda layer, x: layer.train()(x), dims, mode):
            fail(f"{call} with the layer in eval mode (layer.training False) applied dropout",
                 hint=EVAL)
        if mode[0] != P_DROP and _same(out, lambda layer, x: layer(x), dims, (P_DROP, mode[1])):
            fail(f"{call} with layer.p_drop = {mode[0]} dropped out with p = {P_DROP}",
                 hint=FIXED_P.format(fixed=P_DROP, p=mode[0]))
    hint = (f"with recompute={policy!r} the layer must compute what it computes without "
            "recomputation: the layer's ops in its order (ln1, qkv, attention_core, proj, "
            "dropout, residual, ln2, fc1, GeLU, fc2, dropout, residual), dropout and "
            "attention_core from parlab.model.recompute (so the masks are the same draws), "
            "and torch.utils.checkpoint, which replays the random state when it recomputes")
    where = "" if mode[1] else " (eval mode)"
    expect_type(out, Tensor, name=call, what="the layer's output, a tensor of the shape of x")
    assert_close(out, ref_out, name=f"the output of {call}{where}", rtol=1e-6, atol=1e-6,
                 hint=hint)
    names = ["x"] + [n for n, _ in _layers(torch.float32, dims)[0].named_parameters()]
    for name, g, want in zip(names, grads, ref_grads, strict=True):
        assert_close(g, want, name=f"the gradient of {name} through {call}{where}", rtol=1e-6,
                     atol=1e-6, hint=hint)


def _check_bytes(fn: Callable[..., Any], policy: str, dims: Dims, p_drop: float) -> int:
    got = on_learner_side(_learner_bytes, fn, policy, dims, p_drop)
    b, s, h, a = dims
    want = {p: closed_form(b, s, h, a, p) for p in POLICIES}
    if got == want[policy]:
        return got
    scores = a * s * s * b
    if policy != "none" and got == want["none"]:
        hint = ("nothing was recomputed: the attention core must run inside "
                "torch.utils.checkpoint.checkpoint(attention_core, q, k, v, p_drop, training, "
                "use_reentrant=False)" if policy == "selective" else
                "under 'full' the whole layer runs inside one checkpoint, which keeps only x")
    elif policy == "full":
        hint = ("'full' keeps only the layer's input: put the whole layer (both sublayers and "
                "their residual additions) inside one torch.utils.checkpoint call")
    elif got < want[policy]:
        hint = ("you checkpointed more than the attention core (the outputs are the layer's, "
                "and it keeps less): the tensors around it (the LayerNorm output, Q/K/V, the "
                "projection's input) are then recomputed too, which costs their GEMMs again; "
                "checkpoint exactly the attention_core call")
    elif policy == "selective" and (got - want[policy]) % scores == 0 and \
            (got - want[policy]) // scores in (1, 2, 3, 4, 5):
        hint = (f"{(got - want[policy]) // scores} bytes per attention score more than the "
                "table: part of the core (the softmax output 2 bytes, its dropout mask 1, the "
                "dropout output 2 per score) is still kept outside the checkpoint; the whole "
                "attention_core call goes inside it")
    else:
        hint = (f"{got - want[policy]:,} bytes more than the layer's own forward keeps: compute "
                "the layer as it does, keeping what autograd keeps by itself"
                + (", and checkpoint exactly the attention_core call"
                   if policy == "selective" else ""))
    fail(f"recompute_forward(..., {policy!r}) kept {got:,} bytes for backward (b={b}, s={s}, "
         f"h={h}, a={a}, bf16); Korthikanti's table plus the LayerNorm statistics gives "
         f"{want[policy]:,}", hint=hint)
    raise AssertionError  # unreachable


def _check_flops(fn: Callable[..., Any], policy: str, dims: Dims, p_drop: float) -> int:
    total = on_learner_side(_learner_flops, fn, policy, dims, p_drop)
    b, s, h, _ = dims
    f = layer_forward_flops(b, s, h)
    extra = total - 3 * f
    want = {"none": 0, "selective": 2 * b * s * s * h, "full": f}[policy]
    if extra != want:
        reentrant = policy == "selective" and extra == 4 * b * s * s * h
        fail(f"recompute_forward(layer, x, {policy!r}): forward and backward cost "
             f"{total:,} FLOPs: 3F = {3 * f:,} plus {extra:,} recomputed; expected {want:,} "
             "recomputed",
             hint=REENTRANT if reentrant else "selective recomputes only the attention "
                  "core's GEMMs; full reruns the whole forward once: checkpoint exactly those "
                  "and nothing more")
    return extra


@exercise(KEY_RECOMPUTE)
def check_recompute(recompute_forward: Callable[..., Any], saved_bytes_formula: Callable[..., Any],
                    *, shape: tuple[int, int, int] = (B, S, H), heads: int = A,
                    p_drop: float = P_DROP, quiet: bool = False) -> dict[str, dict[str, int]]:
    """The three policies on x of `shape` (b, s, h) through a layer of `heads` heads that
    drops out with `p_drop`: same outputs and gradients in training and in eval mode,
    measured bytes equal to the closed form, the recomputed FLOPs counted; the formula at
    many sizes."""
    not_reexport(recompute_forward, name="recompute_forward")
    b, s, h = shape
    if h % heads or not 0 < p_drop < 1:
        raise ValueError(f"shape={shape}, heads={heads}, p_drop={p_drop}: the heads must "
                         "divide h, and 0 < p_drop < 1")
    dims = (b, s, h, heads)
    measured: dict[str, dict[str, int]] = {}
    for policy in POLICIES:
        _check_values(recompute_forward, policy, dims, (p_drop, True))
        measured[policy] = {"bytes": _check_bytes(recompute_forward, policy, dims, p_drop),
                            "extra_flops": _check_flops(recompute_forward, policy, dims, p_drop)}
    for policy in POLICIES:  # eval mode: dropout is the identity, recomputed or not
        _check_values(recompute_forward, policy, dims, (p_drop, False))
    check_formula(saved_bytes_formula, POINTS + (HIDDEN_POINTS if quiet else []),
                  refuse=_refused(), refusal=REFUSAL)
    if not quiet:
        rows = ", ".join(f"{p} {m['bytes']:,} B (+{m['extra_flops']:,} FLOPs)"
                         for p, m in measured.items())
        print(f"recompute_forward OK: outputs and gradients unchanged, in training and in eval "
              f"mode; kept for backward "
              f"(b={b}, s={s}, h={h}, a={heads}): {rows}; saved_bytes_formula agrees at "
              f"{len(POINTS)} sizes")
    return measured
