r"""Graded checks of module 06, exercises 1 and 2 (one process, float64).

Exercise 1, the router: `router(x, weight, k) -> (gates, experts, aux)` against
`parlab.moe.route` / `balance_loss` (rtol 1e-10): experts exactly (largest first), gates, the
auxiliary loss $E\sum_e f_e P_e$, and the gradients of $\sum g \cdot u + \alpha L_\text{aux}$ with
respect to x and the router weight, on four routings (k = 1, 2, 3; up to 8 experts; skewed
routers), with x and the weight left as they were.
Exercise 2, capacity: `expert_capacity(n_tokens, num_experts, k, capacity_factor)` (an int;
products that are whole, and fractional ones where rounding to nearest and rounding up differ)
and `keep_mask(experts, num_experts, capacity)` (the worked example written out here and seeded
routings, exactly, with `experts` left as it was).

While the learner's code runs, parlab.moe's functions refuse to run (`common.references`).

A right answer does not depend on, and the tests vary: N, C, E and k (the router: 4 routings
with k = 1, 2, 3 and E = 4, 6, 8; the capacity: 8 sizes, fractional products among them; the
keep mask: the worked example and 4 routings with k = 1, 2, 3), the router's skew and the
seed, the upstream gradients (the gates' random, the balance loss's ALPHA = 0.01, as it is
weighted in training: neither is 1);
the hidden tests add `random_cases` drawn from `seed` (other sizes, E up to 16, k up to 4).
Fixed: float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from parlab.check._compare import assert_close, assert_equal, assert_unchanged, expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport, on_learner_side
from parlab.check.moe.common import F64_TOL, KEYS, REFUSAL, references, story
from parlab.errors import CheckFailed

__all__ = ["check_router", "check_capacity", "WORKED", "WORKED_KEEP"]
GATES_RENORM = ("the gates are the softmax probabilities over ALL E experts of the chosen "
                "ones: softmax(x @ weight.T) first, then topk; a softmax over the k chosen "
                "logits renormalises them (GShard's top-2 gate does that; this exercise's "
                "Switch-style gate does not)")
AUX_PROBS = ("P_e is the mean over tokens of the full softmax probability of expert e "
             "(probs.mean(dim=0)), not of the gates")
AUX_SCALE = "the balance loss is E * sum_e f_e P_e: multiply by the number of experts"
AUX_F = ("f_e is the share of all N*k assignments (every choice, not only the first) that "
         "went to expert e: bincount(experts.flatten()) / experts.numel()")
TOKEN_MAJOR = ("serve the assignments choice first: every token's first choice, in token "
               "order, before any token's second choice (experts.t().flatten()), so a second "
               "choice never takes the slot of a first choice")
CEIL = "the capacity is rounded up: math.ceil(capacity_factor * n_tokens * k / num_experts)"
ALPHA = 0.01  # the balance loss's weight in the training loss (Switch Transformer's): the aux's
# upstream gradient is not 1, as the gates' (u, random) is not
KEEP_INPUT = ("keep_mask must not change the routing it is given: build the queue order from a "
              "copy (experts.t().flatten() is one) and return a new mask")


# --- exercise 1: the router -----------------------------------------------------------------

ROUTINGS = ((12, 8, 4, 2, 1, 0.0), (16, 8, 8, 2, 2, 3.0), (10, 6, 4, 1, 3, 1.0),
            (9, 8, 8, 3, 4, 0.5))  # tokens N, hidden C, experts E, k, seed, skew


def _random_routings(count: int, seed: int) -> list[tuple[int, int, int, int, int, float]]:
    """(N, C, E, k, seed, skew) of `count` routings drawn from `seed`, beside ROUTINGS."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=gen))

    out = []
    for i in range(count):
        e = draw(2, 16)
        out.append((draw(3, 24), draw(2, 10), e, draw(1, min(4, e)), 100 * seed + i,
                    0.5 * draw(0, 6)))
    return out


def _router_case(n: int, c: int, e: int, seed: int, skew: float) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g, dtype=torch.float64)
    w = torch.randn(e, c, generator=g, dtype=torch.float64) / c**0.5  # random, not an init
    x[:, 0], w[0, 0] = 1.0, skew  # a constant feature: expert 0 is favoured by `skew`
    return x, w, torch.randn(n, 8, generator=g, dtype=torch.float64)  # upstream, k <= 8


def _wrong_aux(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor,
               gates: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    n, e = x.shape[0], w.shape[0]
    p = torch.softmax(x @ w.t(), dim=-1)
    f = torch.bincount(experts.flatten(), minlength=e).double() / experts.numel()
    f1 = torch.bincount(experts[:, 0], minlength=e).double() / n
    gate_p = torch.zeros(n, e, dtype=torch.float64).scatter(1, experts, gates)
    return [(e * (f * gate_p.mean(0)).sum(), AUX_PROBS), ((f * p.mean(0)).sum(), AUX_SCALE),
            (e * (f1 * p.mean(0)).sum(), AUX_F)]


def _routed(router: Callable, x: torch.Tensor, w: torch.Tensor, up: torch.Tensor, k: int,
            label: str) -> dict:
    """The learner's side of one routing (on_learner_side): its router on copies of x and the
    weight, then backward of sum(gates * u) + ALPHA * aux through its graph; plain data back."""
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = call_learner(label, router, xl, wl, k, refuse=references(), refusal=REFUSAL)
    expect_type(out, tuple, name=label, what="a tuple (gates, experts, aux)")
    if len(out) != 3:
        fail(f"{label} returned a tuple of {len(out)} items, expected (gates, experts, aux)",
             hint="return gates, experts, aux (in that order)")
    g_l, e_l, a_l = out
    a_t = a_l if isinstance(a_l, torch.Tensor) else torch.tensor(float(a_l))
    graphs = isinstance(g_l, torch.Tensor) and g_l.requires_grad and a_t.requires_grad
    backward = ("", "")  # its failure (message, traceback), raised after the values
    if graphs and g_l.shape == (x.shape[0], k) and a_t.numel() == 1:
        try:
            loss = (g_l * up[:, :k]).sum().add(ALPHA * a_t.reshape(()))
            call_learner(f"backward of {label}", loss.backward,
                         refuse=references(), refusal=REFUSAL)
        except CheckFailed as exc:
            backward = (str(exc), exc.learner_traceback)
    return {"out": (g_l, e_l, a_t), "x": xl, "w": wl, "graphs": graphs, "backward": backward,
            "grads": (xl.grad, wl.grad)}


def _one_routing(router: Callable, n: int, c: int, e: int, k: int, seed: int,
                 skew: float) -> None:
    from parlab.moe.layer import balance_loss, route

    label = f"router on N={n} tokens, E={e} experts, k={k}"
    x, w, up = _router_case(n, c, e, seed, skew)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    gates, experts, probs = route(xr, wr, k=k)
    aux = balance_loss(probs, experts, num_experts=e)
    (gates * up[:, :k]).sum().add(ALPHA * aux).backward()
    got = on_learner_side(_routed, router, x, w, up, k, label)
    assert_unchanged(x, got["x"], name="x")
    assert_unchanged(w, got["w"], name="weight")
    g_l, e_l, a_t = got["out"]
    assert_close(e_l, experts.to(e_l.dtype) if isinstance(e_l, torch.Tensor) else experts,
                 name=f"{label}: experts", rtol=0, atol=0,
                 hint="the k experts of each token, largest probability first: "
                      "probs.topk(k, dim=-1)")
    renorm = torch.softmax((x @ w.t()).gather(1, experts), dim=-1)
    assert_close(g_l, gates.detach(), name=f"{label}: gates", **F64_TOL,
                 hint=story(g_l, [(renorm, GATES_RENORM)]) or "the gates are the values of "
                 "softmax(x @ weight.T).topk(k, dim=-1), in the order of the experts")
    assert_close(a_t.reshape(()), aux.detach(), name=f"{label}: aux balance loss", **F64_TOL,
                 hint=story(a_t.reshape(()), _wrong_aux(x, w, experts, gates.detach()))
                 or "L_aux = E * sum_e f_e P_e: f_e over all N*k choices, P_e = probs.mean(0)")
    if not got["graphs"]:
        fail(f"{label}: gates and aux must carry autograd graphs back to x and weight",
             hint="compute them with torch operations on x and weight; do not detach")
    if got["backward"][0]:
        raise CheckFailed(got["backward"][0], learner_traceback=got["backward"][1])
    for name, grad, ref in (("x", got["grads"][0], xr.grad), ("weight", got["grads"][1],
                                                               wr.grad)):
        assert ref is not None
        assert_close(grad, ref, name=f"{label}: grad of sum(gates * u) + {ALPHA:g} * aux "
                     f"w.r.t. {name}",
                     **F64_TOL, hint="use torch.topk (differentiable in its values) and keep "
                     "everything in torch")


@exercise(KEYS["router"])
def check_router(router: Callable, *, random_cases: int = 0, seed: int = 0,
                 quiet: bool = False) -> None:
    """router(x, weight, k) -> (gates (N, k), experts (N, k), aux) against parlab.moe, on
    ROUTINGS and `random_cases` more drawn from `seed`."""
    not_reexport(router, name="router")
    cases = [*ROUTINGS, *_random_routings(random_cases, seed)]
    for case in cases:
        _one_routing(router, *case)
    if not quiet:
        print(f"router OK: experts, gates, balance loss and their gradients match parlab.moe on "
              f"{len(cases)} routings (k = 1, 2, 3; up to 8 experts"
              f"{'; and random ones' if random_cases else ''})")


# --- exercise 2: capacity -----------------------------------------------------------------

WORKED = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0], [2, 0], [0, 3]])  # 6 tokens, E=4, k=2
WORKED_KEEP = torch.tensor([[True, True], [True, True], [True, True], [True, False],
                            [True, False], [False, True]])  # capacity 3 (phi = 1.0)
CAPACITIES = ((6, 4, 2, 1.0), (8, 4, 2, 1.25), (16, 8, 2, 0.5), (10, 4, 1, 1.1),
              (12, 8, 2, 2.0), (9, 4, 2, 1.0), (10, 8, 2, 0.9), (6, 9, 2, 1.25))
"""(N, E, k, phi): whole products, and fractional ones (2.75, 4.5, 2.25, 1.67) where rounding
to nearest and rounding up differ."""


def _token_major(experts: torch.Tensor, e: int, cap: int) -> torch.Tensor:
    seen = [0] * e
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for i in range(experts.shape[0]):
        for j in range(experts.shape[1]):
            ex = int(experts[i, j])
            keep[i, j], seen[ex] = seen[ex] < cap, seen[ex] + 1
    return keep


def _capacities(random_cases: int, seed: int) -> list[tuple[int, int, int, float]]:
    """CAPACITIES, then `random_cases` (N, E, k, phi) drawn from `seed`."""
    gen = torch.Generator().manual_seed(2000 + seed)
    out = list(CAPACITIES)
    for _ in range(random_cases):
        n, e = (int(v) for v in torch.randint(1, 4097, (2,), generator=gen))
        k = 1 + int(torch.randint(0, 8, (), generator=gen))
        phi = round(0.1 + 3.9 * float(torch.rand((), generator=gen)), 3)
        out.append((n, 1 + e % 256, k, phi))
    return out


def _check_expert_capacity(expert_capacity: Callable, random_cases: int = 0,
                           seed: int = 0) -> None:
    from parlab.moe.layer import expert_capacity as ref_cap

    for n, e, k, phi in _capacities(random_cases, seed):
        label = f"expert_capacity(n_tokens={n}, num_experts={e}, k={k}, capacity_factor={phi})"
        got = call_learner("expert_capacity", expert_capacity, n, e, k, phi,
                           refuse=references(), refusal=REFUSAL)
        expect_type(got, int, name=label, what="a whole number of slots (an int)")
        want = ref_cap(n, num_experts=e, k=k, capacity_factor=phi)
        exact = phi * n * k / e
        looks = [how for value, how in ((math.floor(exact), "rounded down (int() or //)"),
                                        (round(exact), "rounded to the nearest (round())"))
                 if got == value != want]
        hint = f"{CEIL}; yours is {' or '.join(looks)}" if looks else CEIL
        assert_equal(got, want, name=label, hint=hint)


def _keep_cases(random_cases: int = 0,
                seed: int = 0) -> list[tuple[torch.Tensor, int, int, torch.Tensor]]:
    from parlab.moe.layer import keep_mask as ref_keep

    cases = [(WORKED, 4, 3, WORKED_KEEP)]
    gen = torch.Generator().manual_seed(5)
    sizes = [(12, 4, 2, 4), (16, 8, 2, 2), (10, 4, 1, 2), (9, 8, 3, 3)]
    drawn = torch.Generator().manual_seed(1000 + seed)
    for _ in range(random_cases):
        n, e = (int(v) for v in torch.randint(4, 25, (2,), generator=drawn))
        e = 2 + e % 15
        k = 1 + int(torch.randint(0, min(4, e), (), generator=drawn))
        sizes.append((n, e, k, 1 + int(torch.randint(0, n * k // e + 1, (), generator=drawn))))
    for n, e, k, cap in sizes:
        ex = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
        ex[: n // 2, 0] = 0  # a popular expert, so that some choices are dropped
        cases.append((ex, e, cap, ref_keep(ex, num_experts=e, capacity=cap)))
    return cases


@exercise(KEYS["capacity"])
def check_capacity(expert_capacity: Callable, keep_mask: Callable, *, random_cases: int = 0,
                   seed: int = 0, quiet: bool = False) -> None:
    """expert_capacity and keep_mask, exactly, on the worked example and seeded routings, and
    `random_cases` more of each drawn from `seed`."""
    not_reexport(expert_capacity, name="expert_capacity")
    not_reexport(keep_mask, name="keep_mask")
    _check_expert_capacity(expert_capacity, random_cases, seed)
    for ex, e, cap, want in _keep_cases(random_cases, seed):
        given = ex.clone()
        got = call_learner("keep_mask", keep_mask, given, e, cap, refuse=references(),
                           refusal=REFUSAL)
        label = (f"keep_mask of a routing of {ex.shape[0]} tokens to {e} experts "
                 f"(k={ex.shape[1]}) with capacity {cap}")
        assert_unchanged(ex, given, name=f"experts (in {label})", hint=KEEP_INPUT)
        hint = story(got, [(_token_major(ex, e, cap), TOKEN_MAJOR)])
        assert_close(got.to(torch.int64) if isinstance(got, torch.Tensor) else got,
                     want.to(torch.int64), name=label, rtol=0, atol=0,
                     hint=hint or "an expert keeps the first `capacity` assignments in the "
                     "order (choice, token); count per expert with a running total")
    if not quiet:
        print(f"expert_capacity and keep_mask OK: {len(CAPACITIES) + random_cases} capacities "
              "(fractional ones rounded up), the worked example and "
              f"{4 + random_cases} seeded routings, exactly")
