r"""Module 03, exercise 5: measuring activation memory as saved tensors.

`saved_bytes(fn, *args, exclude=())` must return the bytes of the storages autograd saves for
backward while fn(*args) runs, each storage once, skipping the storages of `exclude`.

First, six cases whose answer is written out here (float32, x of shape (B, T, C) = (2, 12, 48),
n = B*T*C elements, 4 bytes each):
- x.exp() saves its output: 4n;
- x * x saves x twice, one storage: 4n;
- a Linear(C, 8) with its parameters excluded saves its input: 4n;
- x[:, :2] * w (x without grad, w with) saves a slice of x, which keeps all of x alive: 4n;
- x.exp() with x not requiring grad saves nothing: 0;
- LayerNorm(C) with its parameters excluded saves x, and a mean and 1/std per token: 4n + 8BT.
Then, on t ranks, the regions tensor parallelism leaves whole, for one layer: ln1, dropout
and the residual add, ln2, dropout and the residual add (float32, bool masks). Under TP each
rank runs them on the whole (B, T, C) activation and saves $2(4bsh + 8bs) + 2bsh$ bytes; under
TP + SP on its (B, T/t, C) rows, exactly t times less. The learner's function must agree with
parlab's meter (run before the guard) on both, and the ratio must be t. While it runs,
parlab.costs.activations (the meter and the closed forms) raises CheckFailed.

A right answer must not depend on the dtype (float32 and bool masks here), on whether a saved
tensor is a view (its whole storage counts), on how many times a storage is saved (once), on
t (2 and 3 ranks visible, 4 hidden), or on what `exclude` holds (parameters, or nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parlab.check._compare import assert_equal, expect_type, fail, randomize_parameters
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    call_learner,
    exercise,
    refuse_in_rank,
    run_checked,
)
from parlab.check.sp.common import (
    GEN_SEED,
    HANG,
    KEY_SAVED,
    P_DROP,
    SEED,
    SEQ_DIM,
    B,
    H,
    T,
    reject_reference,
    rows,
)
from parlab.check.tp.common import env

N = B * T * H  # elements of one (B, T, C) activation
VIEW = ("a slice is a view: it keeps its whole storage alive, so count "
        "tensor.untyped_storage().nbytes(), not tensor.numel() * tensor.element_size()")
CASES: dict[str, tuple[int, dict[int, str]]] = {  # case -> (bytes, {wrong answer: hint})
    "exp": (4 * N, {0: "the pack hook must see what x.exp() saves: wrap the call to fn in "
                       "torch.autograd.graph.saved_tensors_hooks(pack, unpack)"}),
    "square": (4 * N, {8 * N: "x * x saves x twice, but it is one storage: count each storage "
                              "once (key them by tensor.untyped_storage().data_ptr())"}),
    "linear": (4 * N, {4 * N + 4 * 8 * H: "skip the storages of the tensors in exclude (the "
                                          "parameters are state, not activations)"}),
    "slice": (4 * N, {4 * B * 2 * H: VIEW}),
    "no_grad": (0, {}),
    "layernorm": (4 * N + 8 * B * T, {4 * N + 8 * B * T + 8 * H: "skip the storages of the "
                                      "tensors in exclude (LayerNorm saves its weight and "
                                      "bias too)"}),
}


def _cases(saved_bytes: Callable[..., Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    x = torch.randn(B, T, H)
    xg = x.clone().requires_grad_()
    lin, ln = nn.Linear(H, 8), nn.LayerNorm(H)
    w = torch.randn(B, 2, H, requires_grad=True)
    calls = {
        "exp": (lambda a: a.exp(), (xg,), ()),
        "square": (lambda a: a * a, (xg,), ()),
        "linear": (lin, (xg,), tuple(lin.parameters())),
        "slice": (lambda a, b: a[:, :2] * b, (x, w), ()),
        "no_grad": (lambda a: a.exp(), (x,), ()),
        "layernorm": (ln, (xg,), tuple(ln.parameters())),
    }
    return {name: call_learner(f"saved_bytes (case {name!r})",
                               functools.partial(saved_bytes, f, *a, exclude=e))
            for name, (f, a, e) in calls.items()}


def _regions(x: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, lns: nn.ModuleList,
             drop: Callable[..., torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    """The regions TP leaves whole: LayerNorms, dropouts, residual additions."""
    h1 = lns[0](x)
    x = x + drop(a1, p_drop=P_DROP, generator=gen)
    h2 = lns[1](x)
    x = x + drop(a2, p_drop=P_DROP, generator=gen)
    return h1 + h2 + x


def _memory_worker(saved_bytes: Callable, seed: int) -> dict:
    from parlab.costs import activations
    from parlab.costs.activations import saved_tensor_bytes
    from parlab.tp import sequence as sp

    rank, t, dev = env()
    torch.manual_seed(seed)
    lns = nn.ModuleList([nn.LayerNorm(H), nn.LayerNorm(H)]).to(dev)
    randomize_parameters(lns, seed=seed)
    whole = [torch.randn(B, T, H, device=dev) for _ in range(3)]
    inputs = {"tp": [w.clone().requires_grad_() for w in whole],
              "sp": [rows(w, rank, t).clone().requires_grad_() for w in whole]}
    keep = sp._shard_keep_mask  # the reference dropout: part of the harness, not refused

    def sp_drop(a: torch.Tensor, *, p_drop: float, generator: torch.Generator) -> torch.Tensor:
        return a * keep(tuple(a.shape), p_drop, generator, None, a.device) / (1 - p_drop)

    drops = {"tp": sp.hidden_dropout, "sp": sp_drop}

    def measure(kind: str, counter: Callable) -> Any:
        gen = torch.Generator().manual_seed(GEN_SEED)
        return counter(_regions, *inputs[kind], lns, drops[kind], gen,
                       exclude=tuple(lns.parameters()))

    ref = {k: measure(k, saved_tensor_bytes) for k in ("tp", "sp")}
    refuse_in_rank([activations.SavedTensorMeter, saved_tensor_bytes,
                    activations.activation_breakdown, activations.activation_bytes_per_layer],
                   "parlab.costs.activations (its meter of saved tensors)")
    got = {k: call_learner(f"saved_bytes of the non-TP regions under {k.upper()}",
                           functools.partial(measure, k, saved_bytes), shape_hint=SEQ_DIM)
           for k in ("tp", "sp")}
    return {"cases": _cases(saved_bytes) if rank == 0 else None, "ref": ref, "got": got}


@exercise(KEY_SAVED)
def check_saved_bytes(saved_bytes: Callable[..., Any], *, world_size: int = 2,
                      seed: int = SEED, timeout: float = CHECK_TIMEOUT_S,
                      quiet: bool = False) -> dict:
    """saved_bytes on six cases with known answers, then on the non-TP regions of a layer under
    TP and TP + SP on every rank: equal to parlab's meter, and t times less under SP."""
    reject_reference(saved_bytes, "saved_bytes")
    t = world_size
    results = run_checked(_memory_worker, t, saved_bytes, seed, what="saved_bytes",
                          timeout=timeout, hang_hint=HANG)
    for name, got in results[0]["cases"].items():
        want, wrong = CASES[name]
        expect_type(got, int, name=f"saved_bytes (case {name!r})", rank=0,
                    what="a whole number of bytes (an int: the sum of storage.nbytes())")
        assert_equal(got, want, name=f"saved_bytes, case {name!r} (see the docstring of "
                     "parlab.check.sp.memory)", rank=0, hint=wrong.get(got))
    for rank, r in enumerate(results):
        for kind in ("tp", "sp"):
            expect_type(r["got"][kind], int, rank=rank, what="a whole number of bytes",
                        name=f"saved_bytes of the non-TP regions under {kind.upper()}")
            assert_equal(r["got"][kind], r["ref"][kind], rank=rank,
                         name=f"saved bytes of the non-TP regions under {kind.upper()}",
                         hint="count every saved storage once, parameters excluded")
        if r["got"]["tp"] != t * r["got"]["sp"]:
            fail(f"the non-TP regions save {r['got']['tp']} B under TP and {r['got']['sp']} B "
                 f"under TP + SP: expected a ratio of exactly t = {t}", rank=rank,
                 hint="count what autograd saves the same way in both runs: every storage "
                      "once, at its full size, parameters excluded")
    r0 = results[0]["got"]
    summary = {"b": B, "s": T, "h": H, "t": t, "tp": r0["tp"], "sp": r0["sp"],
               "ratio": r0["tp"] / r0["sp"], "closed_form_tp": 2 * (4 * N + 8 * B * T) + 2 * N}
    if not quiet:
        print(f"saved_bytes OK: six known cases; on {t} ranks the non-TP regions of a layer "
              f"(b={B}, s={T}, h={H}, float32) save {summary['tp']:,} B per rank under TP and "
              f"{summary['sp']:,} B under TP + SP: {summary['ratio']:g}x less")
    return summary
