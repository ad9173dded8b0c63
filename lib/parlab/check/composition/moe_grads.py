r"""Graded check of module 07, exercise 1d: MoE gradients reduced over the right groups.

`reduce_moe_grads(dense, experts, groups)`, after `backward`, on every rank: `dense` and
`experts` are lists of this rank's parameters, `groups` what the learner's `moe_groups`
returned. Run on the ranks of a grid with EP (and CP, TP or PP) around a small MoE block,
float64:

    h = x W_in^T;   y = h + MoE(h) + shared(h);   loss = mean over tokens of (y W_out^T) . r

MoE is module 06's expert-parallel layer, `parlab.moe.ep_moe` over the EP group of
`parlab.mesh`'s grid: E = 4 experts, top-2, dropless, E/ep per rank (`ExpertShard`), dispatched
with all-to-alls; shared is one always-on expert of the same form (DeepSeekMoE's). Dense: W_in,
the router, the shared expert and W_out; experts: this rank's (E/ep, C, F) w1 and (E/ep, F, C)
w2. Replica (dp, ep) takes rows (dp·e + ep)·b .. of the global batch, CP rank c its c-th block
of positions. A TP or PP coordinate holds another piece of the model, never a copy: here each
(pp, tp) place trains a block of its own (its own seeded weights) on the same rows, so the
ranks of a place are the whole story of that block, and a reduction that crosses places, or
divides by the world size, is wrong by more than rounding. After the learner's reduction
every rank's gradients must equal its place's single-device block's on the whole batch
(`parlab.moe.moe_reference`, one token at a time, autograd, in this process), its experts'
rows for the experts: rtol 1e-9. The tokens of the ranks with dp = cp = 0 avoid the experts of
ep rank 0, so that rank computes nothing for its experts and their .grad is None, while their
copies on the other dp (or cp) ranks have one. Visible: DP 2 × EP 2 and EP 2 × TP 2 (4 ranks
each: in the second the dense group has 2 ranks of the world's 4); hidden: PP 2 × EP 2 × CP 2
and DP 2 × EP 2 × CP 2 (8). A wrong gradient is compared with the likely reductions (from the
ranks' gradients before the call) and named, all of them when two give the same numbers.

A right answer must not depend on: the world size against the dense group's (dividing by
dist.get_world_size() passes only where pp = tp = 1), which axes vary (dp, ep, cp, one or
several), or whether a rank's experts got a token (.grad None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from parlab.check._compare import assert_close, fail
from parlab.check._harness import (
    CHECK_TIMEOUT_S,
    cpu,
    env,
    exercise,
    not_reexport,
    refuse_in_rank,
    run_checked,
)
from parlab.check.composition.common import KEYS
from parlab.check.composition.moe_groups import (
    HINTS,
    REFUSAL,
    call_guarded,
    references,
)

__all__ = ["check_moe_grads", "GRAD_CASES", "DENSE", "EXPERT", "reference_grads", "weights"]

C, F, E, K, B_REPLICA, T_RANK = 8, 8, 4, 2, 2, 3  # width, SwiGLU width, experts, top-k, sizes
DENSE = ("w_in", "router", "shared_w1", "shared_w2", "w_out")
EXPERT = ("w1", "w2")
GRAD_CASES = {"visible": [{"dp": 2, "ep": 2}, {"ep": 2, "tp": 2}],
              "hidden": [{"pp": 2, "ep": 2, "cp": 2}, {"dp": 2, "ep": 2, "cp": 2}]}
RTOL, ATOL = 1e-9, 1e-12
HANG = ("every rank of a group must all-reduce the same tensors in the same order. An expert "
        "that got no token on a rank has .grad None there while its copies have one: give it "
        "zeros (p.grad = torch.zeros_like(p)) and reduce it, never skip it. And every rank "
        "creates every group (exercise 1b)")
SCALE = ("each rank's expert gradient already sums what every EP rank's tokens sent it: "
         "sum over the expert group, then divide by the dense group's size d·e·c (the number "
         "of losses averaged), not by the expert group's d·c")
WORLD = ("divide by the dense group's size d·e·c, dist.get_world_size(groups['dense']), not by "
         "the world size: the TP and PP ranks hold other pieces of the model, not more data "
         "(the two sizes agree only where pp = tp = 1)")


def _sizes(sizes: dict[str, int]) -> tuple[int, int, int]:
    return sizes.get("dp", 1), sizes.get("ep", 1), sizes.get("cp", 1)


def weights(sizes: dict[str, int], place: tuple[int, int] = (0, 0)) -> dict[str, Tensor]:
    """The float64 weights of the block of `place` (its pp and tp coordinates), its tokens x
    and the loss's direction r (global batch)."""
    d, e, c = _sizes(sizes)
    gen = torch.Generator().manual_seed(3300 + 100 * d + 10 * e + c + 1000 * place[0]
                                        + 5000 * place[1])

    def rand(*shape: int) -> Tensor:
        return 0.3 * torch.randn(*shape, generator=gen, dtype=torch.float64)

    w = {"w_in": rand(C, C), "router": rand(E, C), "shared_w1": rand(C, F),
         "shared_w2": rand(F, C), "w1": rand(E, C, F), "w2": rand(E, F, C), "w_out": rand(C, C)}
    w["w_in"][0] = torch.eye(C, dtype=torch.float64)[0]  # h[..., 0] = x[..., 0]
    w["router"][:, 0] = torch.where(torch.arange(E) < E // e, 4.0, -4.0)  # steers by x[..., 0]
    batch, seq = B_REPLICA * d * e, T_RANK * c
    x = 0.5 * torch.randn(batch, seq, C, generator=gen, dtype=torch.float64)
    x[..., 0] = torch.rand(batch, seq, generator=gen, dtype=torch.float64) - 0.5
    if d * c > 1:  # dp = 0, cp = 0: tokens that avoid ep rank 0's experts
        x[:B_REPLICA * e, :T_RANK, 0] = -3.0
    return {**w, "x": x, "r": torch.randn(batch, seq, C, generator=gen, dtype=torch.float64)}


def _block(w: dict[str, Any], x: Tensor, r: Tensor, moe: Callable[..., Tensor]) -> Tensor:
    """The loss of the block on tokens x (b, n, C): mean over tokens of (y W_out^T) . r, with
    y = h + MoE(h) + shared(h); `moe(h, gates, experts)` returns h + MoE(h) on (N, C) rows."""
    from parlab.moe import ffn, route

    h = (x @ w["w_in"].t()).reshape(-1, C)  # (N, C)
    gates, experts, _ = route(h, w["router"], k=K)  # (N, k), (N, k)
    y = moe(h, gates, experts) + ffn(h, w["shared_w1"], w["shared_w2"])  # (N, C)
    return ((y @ w["w_out"].t()) * r.reshape(-1, C)).sum(-1).mean()


def _single_moe(w: dict[str, Tensor]) -> Any:
    from parlab.moe import MoE

    moe = MoE(C, F, E, k=K).double()
    with torch.no_grad():
        for name in ("router", *EXPERT):
            getattr(moe, name).copy_(w[name])
    return moe


def reference_grads(sizes: dict[str, int], place: tuple[int, int] = (0, 0)
                    ) -> dict[str, Tensor]:
    """Single-device gradients of the block of `place` over the whole global batch (module
    06's token-at-a-time MoE, `parlab.moe.moe_reference`)."""
    from parlab.moe import moe_reference

    w = weights(sizes, place)
    moe = _single_moe(w)
    leaves = {n: (getattr(moe, n) if n in ("router", *EXPERT) else w[n].clone().requires_grad_())
              for n in (*DENSE, *EXPERT)}
    _block(leaves, w["x"], w["r"], lambda h, g, ex: moe_reference(
        h, g, ex, moe.expert, num_experts=E)).backward()
    return {n: p.grad.detach().clone() for n, p in leaves.items() if p.grad is not None}


def _worker(moe_groups: Callable, reduce: Callable, sizes: dict[str, int]) -> dict[str, Any]:
    from torch import nn

    from parlab.mesh import make_mesh, new_groups
    from parlab.moe import ExpertShard, ep_moe

    rank, world, dev = env()
    mesh = make_mesh(world, **sizes)  # the check's own grid, and the layer's EP group
    coords, ep_group = mesh.coords(rank), new_groups(mesh, axes=("ep",))["ep"]
    w = {k: v.to(dev) for k, v in weights(sizes, (coords["pp"], coords["tp"])).items()}
    d, e, c = _sizes(sizes)
    replica = coords["dp"] * e + coords["ep"]
    rows = slice(replica * B_REPLICA, (replica + 1) * B_REPLICA)
    cols = slice(coords["cp"] * T_RANK, (coords["cp"] + 1) * T_RANK)
    shard = ExpertShard(_single_moe(w), coords["ep"], e).to(dev)
    params = {n: nn.Parameter(w[n].clone()) for n in DENSE}
    params.update({n: getattr(shard, n) for n in EXPERT})
    refuse_in_rank(references(), REFUSAL)
    groups = call_guarded(f"moe_groups({sizes})", moe_groups, dict(sizes))
    loss = _block(params, w["x"][rows, cols], w["r"][rows, cols],
                  lambda h, g, ex: ep_moe(h, g, ex, shard, group=ep_group))
    loss.backward()
    before = {n: None if p.grad is None else cpu(p.grad) for n, p in params.items()}
    call_guarded("reduce_moe_grads(dense, experts, groups)", reduce,
                 [params[n] for n in DENSE], [params[n] for n in EXPERT], groups)
    return {"before": before, "after": {n: None if p.grad is None else cpu(p.grad)
                                        for n, p in params.items()}, "first": shard.first}


def _candidates(results: list[dict], sizes: dict[str, int], name: str, rank: int
                ) -> list[tuple[str, Tensor]]:
    """(hint, value) of the likely wrong reductions of parameter `name` on `rank`."""
    from parlab.check.composition.moe_groups import _members

    world = len(results)
    local = [r["before"][name] if r["before"][name] is not None
             else torch.zeros_like(results[rank]["after"][name]) for r in results]

    def over(vary: tuple[str, ...], divide: int) -> Tensor:
        return torch.stack([local[s] for s in _members(world, sizes, vary)[rank]]).sum(0) / divide

    d, e, c = _sizes(sizes)
    dense = name in DENSE
    sums = [("dense", ("dp", "ep", "cp")), ("expert", ("dp", "cp")), ("dp", ("dp",)),
            ("dp_ep", ("dp", "ep")), ("world", ("dp", "pp", "ep", "cp", "tp"))]
    out = [("not reduced: " + ("average over the dense group" if dense else SCALE), local[rank])]
    for label, vary in sums:
        n = len(_members(world, sizes, vary)[rank])
        for divide in dict.fromkeys((n, 1, d * e * c, world)):
            right = (label, divide) == (("dense", n) if dense else ("expert", d * e * c))
            if right:
                continue
            if label == "world" and world != d * e * c:
                hint = HINTS["tp_or_pp"]
            elif divide == world != d * e * c and label == ("dense" if dense else "expert"):
                hint = WORLD
            elif label in ("dense", "dp_ep") and not dense and e > 1:
                hint = HINTS["experts_mixed"]
            elif label in ("expert", "dp") and dense and e > 1:
                hint = HINTS["ep_left_out"]
            elif label != ("dense" if dense else "expert"):
                hint = HINTS["cp_forgotten"]
            elif dense:
                hint = "average over the dense group: all-reduce, then divide by its size"
            else:
                hint = SCALE
            out.append((hint, over(vary, divide)))
    return out


def _check(results: list[dict], sizes: dict[str, int]) -> None:
    refs: dict[tuple[int, int], dict[str, Tensor]] = {}
    grid = " × ".join(f"{a.upper()} {n}" for a, n in sizes.items())
    e_local = E // sizes.get("ep", 1)
    for rank, res in enumerate(results):
        # the place: this rank's pp and tp coordinates (TP innermost, then CP, EP, PP)
        tp_c = rank % sizes.get("tp", 1)
        pp_c = (rank // (sizes.get("tp", 1) * sizes.get("cp", 1) * sizes.get("ep", 1))
                % sizes.get("pp", 1))
        if (pp_c, tp_c) not in refs:
            refs[pp_c, tp_c] = reference_grads(sizes, (pp_c, tp_c))
        ref = refs[pp_c, tp_c]
        first = res["first"]
        for name in (*DENSE, *EXPERT):
            want = ref[name] if name in DENSE else ref[name][first:first + e_local]
            got = res["after"][name]
            kind = "dense" if name in DENSE else f"experts {first}..{first + e_local - 1}"
            label = f"{name}.grad ({kind}) after reduce_moe_grads on {grid}"
            if got is None:
                fail(f"{label} is None", rank=rank, hint="give a parameter without a gradient "
                     "zeros (an expert that got no token here), then reduce it with its copies")
            if got.shape == want.shape and torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                continue
            found = list(dict.fromkeys(
                h for h, v in _candidates(results, sizes, name, rank)
                if v.shape == got.shape and torch.allclose(got, v, rtol=RTOL, atol=ATOL)))
            # two reductions can give the same numbers on a small grid: name every one
            hint = (None if not found else found[0] if len(found) == 1
                    else "either " + ", or ".join(found))
            assert_close(got, want, name=label + " against one device", rank=rank, rtol=RTOL,
                         atol=ATOL, hint=hint or (
                             "dense gradients: mean over the dense group; expert gradients: "
                             "sum over the expert group divided by the dense group's size"))


@exercise(KEYS["moe_grads"], needs={KEYS["moe_groups"]: "moe_groups (exercise 1c)"})
def check_moe_grads(moe_groups: Callable[[dict], dict], reduce_moe_grads: Callable[..., None],
                    *, quiet: bool = False, timeout: float = CHECK_TIMEOUT_S) -> None:
    """The block's gradients after reduce_moe_grads against one device: the visible grid, or
    with quiet=True (the hidden test, right after the visible one) the hidden grids."""
    not_reexport(moe_groups, name="moe_groups")
    not_reexport(reduce_moe_grads, name="reduce_moe_grads")
    for sizes in GRAD_CASES["hidden" if quiet else "visible"]:
        d, e, c = _sizes(sizes)
        world = d * e * c * sizes.get("pp", 1) * sizes.get("tp", 1)
        results = run_checked(_worker, world, moe_groups, reduce_moe_grads, sizes,
                              what=f"reduce_moe_grads on {sizes}", timeout=timeout,
                              hang_hint=HANG)
        _check(results, sizes)
    if not quiet:
        print("reduce_moe_grads OK on DP 2 × EP 2 and EP 2 × TP 2: dense gradients (W_in, "
              "router, shared expert, W_out) and each rank's experts equal one device's, the "
              "experts without tokens on rank 0 included (dense and expert groups from your "
              "moe_groups)")
