r"""Graded checks of module 06, "Expert parallelism": exercises 1 and 2 here (one process);
3 and 4 (dispatch and combine on t ranks) in `parlab.check.moe_ep`, importable from here.

Exercise 1, the router: `router(x, weight, k) -> (gates, experts, aux)` against
`parlab.moe.route` / `balance_loss` in float64 (rtol 1e-10): experts exactly (largest first),
gates, the auxiliary loss $E\sum_e f_e P_e$, and the gradients of
$\sum g \cdot u + L_\text{aux}$ with respect to x and the router weight.
Exercise 2, capacity: `expert_capacity(n_tokens, num_experts, k, capacity_factor)` and
`keep_mask(experts, num_experts, capacity)`, compared exactly on a worked example written out
here and on seeded routings.

While the learner's code runs, parlab's own MoE functions raise CheckFailed (their code objects
are swapped, so aliases and wrappers are caught too), and are restored afterwards.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from parlab.check import CheckFailed, assert_close, assert_equal, fail, not_reexport
from parlab.errors import refused

__all__ = ["check_router", "check_capacity", "CheckFailed", "blocked_reference"]
_LATER = {"check_ep_moe": "moe_ep", "check_ep_capacity": "moe_ep", "check_a2a_bytes": "moe_ep"}
F64_TOL = {"rtol": 1e-10, "atol": 1e-12}
REFERENCE = ("your answer runs parlab's own MoE reference implementation (parlab.moe / "
             "parlab.moe.dispatch); the exercise is to write it yourself")
GATES_RENORM = ("the gates are the softmax probabilities over ALL E experts of the chosen "
                "ones: softmax(x @ weight.T) first, then topk; a softmax over the k chosen "
                "logits renormalises them")
AUX_PROBS = ("P_e is the mean over tokens of the full softmax probability of expert e "
             "(probs.mean(dim=0)), not of the gates")
AUX_SCALE = "the balance loss is E * sum_e f_e P_e: multiply by the number of experts"
AUX_F = ("f_e is the share of all N*k assignments (every choice, not only the first) that "
         "went to expert e: bincount(experts.flatten()) / experts.numel()")
TOKEN_MAJOR = ("serve the assignments choice first: every token's first choice, in token "
               "order, before any token's second choice (experts.t().flatten()), so a second "
               "choice never takes the slot of a first choice")
CEIL = "the capacity is rounded up: math.ceil(capacity_factor * n_tokens * k / num_experts)"


def _functions() -> list[Callable[..., Any]]:
    from parlab import moe
    from parlab.moe import dispatch as moe_dispatch

    names = ["route", "balance_loss", "expert_capacity", "keep_mask", "queue_position",
             "moe_reference", "load_stats"]
    return ([getattr(moe, n) for n in names] + [moe.MoE.forward, moe_dispatch.ep_moe,
            moe_dispatch.ep_moe_capacity, moe_dispatch.all_to_all, moe_dispatch._exchange_counts,
            moe_dispatch._run_local, moe_dispatch.AllToAll.forward, moe_dispatch.AllToAll.backward])


def blocked_reference() -> contextlib.AbstractContextManager[None]:
    """Inside the block, every function of parlab's MoE reference raises CheckFailed."""
    return refused(_functions(), REFERENCE)


def _call(stage: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        with blocked_reference():
            return fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        fail(f"{stage} raised {type(exc).__name__}: {exc}", hint="read the error above")


def _story(got: Any, candidates: list[tuple[torch.Tensor, str]]) -> str | None:
    for wrong, hint in candidates:
        if isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(
                got.double(), wrong.double(), rtol=1e-9, atol=1e-12):
            return hint
    return None


# --- exercise 1: the router -----------------------------------------------------------------

def _router_case(n: int, c: int, e: int, seed: int, skew: float) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=torch.float64)
    w = torch.randn(e, c, generator=g, dtype=torch.float64) / c**0.5
    x[:, 0], w[0, 0] = 1.0, skew  # a constant feature: expert 0 is favoured by `skew`
    return x, w, torch.randn(n, 8, generator=g, dtype=torch.float64)  # upstream, k <= 8


def check_router(router: Callable, *, quiet: bool = False) -> None:
    """router(x, weight, k) -> (gates (N, k), experts (N, k), aux) against parlab.moe."""
    from parlab.moe.layer import balance_loss, route

    not_reexport(router, name="router")
    for n, c, e, k, seed, skew in ((12, 8, 4, 2, 1, 0.0), (16, 8, 8, 2, 2, 3.0),
                                   (10, 6, 4, 1, 3, 1.0), (9, 8, 8, 3, 4, 0.5)):
        label = f"router on N={n} tokens, E={e} experts, k={k}"
        x, w, up = _router_case(n, c, e, seed, skew)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        gates, experts, probs = route(xr, wr, k=k)
        aux = balance_loss(probs, experts, num_experts=e)
        (gates * up[:, :k]).sum().add(aux).backward()
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = _call(label, router, xl, wl, k)
        if not isinstance(out, tuple) or len(out) != 3:
            fail(f"{label} returned {type(out).__name__}, expected (gates, experts, aux)")
        g_l, e_l, a_l = out
        assert_close(e_l, experts.to(e_l.dtype) if isinstance(e_l, torch.Tensor) else experts,
                     name=f"{label}: experts", rtol=0, atol=0,
                     hint="the k experts of each token, largest probability first: "
                          "probs.topk(k, dim=-1)")
        logits = x @ w.t()
        renorm = torch.softmax(logits.gather(1, experts), dim=-1)
        assert_close(g_l, gates.detach(), name=f"{label}: gates", **F64_TOL,
                     hint=_story(g_l, [(renorm, GATES_RENORM)]))
        p = torch.softmax(logits, dim=-1)
        f = torch.bincount(experts.flatten(), minlength=e).double() / experts.numel()
        f1 = torch.bincount(experts[:, 0], minlength=e).double() / n
        gate_p = torch.zeros(n, e, dtype=torch.float64).scatter(1, experts, gates.detach())
        wrong = [(e * (f * gate_p.mean(0)).sum(), AUX_PROBS), ((f * p.mean(0)).sum(), AUX_SCALE),
                 (e * (f1 * p.mean(0)).sum(), AUX_F)]
        a_t = a_l if isinstance(a_l, torch.Tensor) else torch.tensor(float(a_l))
        assert_close(a_t.reshape(()), aux.detach(), name=f"{label}: aux balance loss",
                     **F64_TOL, hint=_story(a_t.reshape(()), wrong))
        if not (isinstance(g_l, torch.Tensor) and g_l.requires_grad and a_t.requires_grad):
            fail(f"{label}: gates and aux must carry autograd graphs back to x and weight",
                 hint="compute them with torch operations on x and weight; do not detach")
        loss = (g_l * up[:, :k]).sum().add(a_t)
        _call(f"backward of {label}", loss.backward)
        for name, got, ref in (("x", xl.grad, xr.grad), ("weight", wl.grad, wr.grad)):
            assert_close(got, ref, name=f"{label}: grad of sum(gates * u) + aux w.r.t. {name}",
                         **F64_TOL, hint="use torch.topk (differentiable in its values) and "
                         "keep everything in torch")
    if not quiet:
        print("router OK: experts, gates, balance loss and their gradients match parlab.moe on "
              "4 routings (k = 1, 2, 3; up to 8 experts)")


# --- exercise 2: capacity -----------------------------------------------------------------

WORKED = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0], [0, 3]])  # 6 tokens, E=4, k=2
WORKED_KEEP = torch.tensor([[True, True], [True, True], [True, True], [True, False],
                            [True, False], [False, True]])  # capacity 3 (phi = 1.0)


def _token_major(experts: torch.Tensor, e: int, cap: int) -> torch.Tensor:
    seen = [0] * e
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for i in range(experts.shape[0]):
        for j in range(experts.shape[1]):
            ex = int(experts[i, j])
            keep[i, j], seen[ex] = seen[ex] < cap, seen[ex] + 1
    return keep


def check_capacity(expert_capacity: Callable, keep_mask: Callable, *, quiet: bool = False) -> None:
    """expert_capacity and keep_mask, exactly, on the worked example and seeded routings."""
    from parlab.moe.layer import expert_capacity as ref_cap
    from parlab.moe.layer import keep_mask as ref_keep

    not_reexport(expert_capacity, name="expert_capacity")
    not_reexport(keep_mask, name="keep_mask")
    for n, e, k, phi in ((6, 4, 2, 1.0), (8, 4, 2, 1.25), (16, 8, 2, 0.5), (10, 4, 1, 1.1),
                         (12, 8, 2, 2.0)):
        got = _call("expert_capacity", expert_capacity, n, e, k, phi)
        hint = CEIL if got == math.floor(phi * n * k / e) else None
        assert_equal(got, ref_cap(n, num_experts=e, k=k, capacity_factor=phi),
                     name=f"expert_capacity(n_tokens={n}, num_experts={e}, k={k}, "
                          f"capacity_factor={phi})", hint=hint)
    cases = [(WORKED, 4, 3, WORKED_KEEP)]
    gen = torch.Generator().manual_seed(5)
    for n, e, k, cap in ((12, 4, 2, 4), (16, 8, 2, 2), (10, 4, 1, 2), (9, 8, 3, 3)):
        ex = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
        ex[: n // 2, 0] = 0  # a popular expert, so that some choices are dropped
        cases.append((ex, e, cap, ref_keep(ex, num_experts=e, capacity=cap)))
    for ex, e, cap, want in cases:
        got = _call("keep_mask", keep_mask, ex.clone(), e, cap)
        hint = _story(got, [(_token_major(ex, e, cap), TOKEN_MAJOR)])
        assert_close(got.to(torch.int64) if isinstance(got, torch.Tensor) else got,
                     want.to(torch.int64), name=f"keep_mask of a routing of {ex.shape[0]} tokens"
                     f" to {e} experts (k={ex.shape[1]}) with capacity {cap}", rtol=0, atol=0,
                     hint=hint or "an expert keeps the first `capacity` assignments in the "
                     "order (choice, token); count per expert with a running total")
    if not quiet:
        print("expert_capacity and keep_mask OK: the worked example and 4 seeded routings, "
              "exactly")


def __getattr__(name: str) -> Any:
    """Exercises 3 and 4 live in parlab.check.moe_ep; reached from here."""
    if name in _LATER:
        import importlib

        return getattr(importlib.import_module(f"parlab.check.{_LATER[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
