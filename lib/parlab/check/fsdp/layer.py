r"""Module 01, exercise 2: `check_fsdp_layer(FSDPLinear)` against a single-device DDP step.

Sizes: nn.Linear(in, out) in float32 (8 x 8 visible; hidden 5 -> 6 as well, so no size can be
special-cased), every parameter randomised, P = out (in + 1) parameters flattened as
[vec W; b]; rank r keeps elements [r n, (r+1) n), n = P / d (d ranks; P a multiple of d: no
padding). Each rank feeds its own N = 3 rows x_r and backpropagates sum(y_r * u_r) for its
own upstream u_r.

Reference (in the parent, plain torch): the single-device layer with DDP's averaged gradient
$\bar g = \frac{1}{d}\sum_q \nabla_\theta \mathrm{sum}(y_q u_q)$, one SGD step
$\theta \leftarrow \theta - 0.1\,\bar g$. Rank r must hold: one parameter, its shard, in a
storage of its own; its output $y_r$ and input gradient $u_r W$ (rtol=1e-5, atol=1e-6:
float32, summation order only); its shard of $\bar g$ and of the updated $\theta$; nothing of
the gathered $\theta$ still referenced by the layer after backward; and the bytes
$3\frac{d-1}{d}\cdot 4P$ (all-gather in forward, all-gather again in backward, reduce-scatter
of the gradient). parlab.dp.fsdp is refused in the ranks.

A right answer does not depend on, and the tests vary: the layer's sizes (visible 8 x 8 on 2
ranks and 2 -> 3 on 3, hidden 5 -> 6), the world size (visible 2 and 3, hidden 4), what each
rank holds (its own rows x_r) and the upstream gradient of the custom autograd Function
(random and different on every rank, never 1, so a backward that drops grad_y fails). Fixed:
float32 (the helpers' test varies the dtype), N = 3 rows (x is (N, in), as the exercise says).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import parlab.check._harness as harness
from parlab.check._compare import assert_owns_only, fail, randomize_parameters
from parlab.check.fsdp.common import (
    ALL_REDUCE,
    close,
    cpu,
    env,
    kinds,
    not_fsdp,
    refuse_fsdp_in_rank,
    what,
)
from parlab.check.fsdp.shards import OFFSET, VIEW, shard_story

__all__ = ["check_fsdp_layer"]

N, LR, SEED = 3, 0.1, 1234
KEPT = ("the gathered weight is kept after backward: FSDP frees the full parameters once a "
        "layer's backward is done (only the shard lives between steps); do not store the "
        "gathered tensor on the module")
SHAPES = ("the flat parameter is [vec W; b], (P,), with P = out*(in+1); each rank's shard is "
          "(P/d,); W = flat[:out*in].view(out, in), b = flat[out*in:]")


def _problem(d: int, in_f: int, out_f: int) -> tuple[nn.Linear, list, list]:
    torch.manual_seed(SEED)
    linear = nn.Linear(in_f, out_f)
    randomize_parameters(linear, seed=SEED + in_f * 31 + out_f)
    xs = [torch.randn(N, in_f, generator=torch.Generator().manual_seed(100 + q)) for q in range(d)]
    ups = [torch.randn(N, out_f, generator=torch.Generator().manual_seed(200 + q))
           for q in range(d)]
    return linear, xs, ups


def _traced(stage: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple]]:
    from parlab import comm

    with comm.trace() as tr:
        out = harness.call_learner(stage, fn, *args, shape_hint=SHAPES)
    return out, kinds(tr.events)


def _kept(obj: Any, params: set[int], numel: int, depth: int = 0) -> list[str]:
    """Tensors of at least P elements reachable from the layer's attributes, except params."""
    found: list[str] = []
    items = (vars(obj).items() if hasattr(obj, "__dict__") and depth == 0
             else obj.items() if isinstance(obj, dict)
             else enumerate(obj) if isinstance(obj, (list, tuple)) else ())
    for key, value in items:
        if isinstance(value, torch.Tensor):
            if value.numel() >= numel and id(value) not in params:
                found.append(f"{key}: {tuple(value.shape)}")
        elif depth < 3 and isinstance(value, (dict, list, tuple)):
            found += _kept(value, params, numel, depth + 1)
    return found


def _flat_of(tensors: list[Any]) -> torch.Tensor | None:
    if not tensors or any(t is None for t in tensors):
        return None
    return cpu(torch.cat([t.detach().flatten() for t in tensors]))


def _worker(cls: Callable[..., Any], in_f: int, out_f: int) -> dict:
    rank, d, dev = env()
    refuse_fsdp_in_rank()
    linear, xs, ups = _problem(d, in_f, out_f)
    layer = harness.call_learner("FSDPLinear(linear)", cls, copy.deepcopy(linear).to(dev),
                                 shape_hint=SHAPES)
    params = list(layer.parameters())
    flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
    _check_shard(sum(p.numel() for p in params), _flat_of(params), flat, rank, d)
    for p in params:
        assert_owns_only(p, name="the layer's shard parameter", rank=rank, hint=VIEW)
    out: dict[str, Any] = {}
    x = xs[rank].to(dev).requires_grad_()
    y, out["forward"] = _traced("FSDPLinear.forward", layer, x)
    out["y"] = cpu(y)
    if not isinstance(y, torch.Tensor) or y.shape != (N, out_f) or not y.requires_grad:
        return out
    _, out["backward"] = _traced("the backward pass", (y * ups[rank].to(dev)).sum().backward)
    out["kept"] = _kept(layer, {id(p) for p in params}, out_f * (in_f + 1))
    out["grad_x"] = cpu(x.grad)
    out["grad"] = _flat_of([p.grad for p in params])
    if out["grad"] is not None:
        torch.optim.SGD(params, lr=LR).step()
        out["after"] = _flat_of(params)
    return out


def _check_shard(numel: int, shard: torch.Tensor | None, flat: torch.Tensor, rank: int,
                 d: int) -> None:
    """In the rank, before anything runs: one parameter of P/d elements, rank r's."""
    n = flat.numel() // d
    if numel != n or shard is None:
        fail(f"the layer holds {numel} parameter elements, expected its shard of "
             f"{flat.numel()}/{d} = {n}", rank=rank, hint="each rank keeps one nn.Parameter, "
             "its shard (P/d,): the whole weight must not be a parameter of the layer, and "
             "the shard's size comes from the layer (P = out*(in+1)), never a fixed number")
    if not torch.equal(shard, flat[rank * n:(rank + 1) * n]):
        fail("the shard holds the wrong elements of the flat parameter", rank=rank,
             hint=shard_story(shard, flat, rank, d) + OFFSET)


def _check_step(res: dict, ref: dict, rank: int, d: int) -> None:
    mine = slice(rank * ref["n"], (rank + 1) * ref["n"])
    names = [k for k, _ in res["forward"]]
    if not names or set(names) != {"all_gather"}:
        fail(f"the forward made these collective calls: {names or 'none'}; expected "
             "all-gathers only", rank=rank, hint="forward all-gathers the shards into the "
             "flat parameter (all_gather_flat: dist.all_gather, then torch.cat)")
    y, y_ref = res["y"], ref["y"][rank]
    if not isinstance(y, torch.Tensor) or y.shape != y_ref.shape:
        fail(f"FSDPLinear.forward returned {what(y)}, expected a tensor of shape "
             f"{tuple(y_ref.shape)}", rank=rank, hint="return the output of "
             "FSDPLinearFunction.apply(x, self.shard, ...): y = x W^T + b, (N, out)")
    if not close(y, y_ref):
        fail("the forward output differs from x W^T + b", rank=rank, hint="unflatten the "
             "gathered vector as W = flat[:out*in].view(out, in), b = flat[out*in:]")
    if "backward" not in res:
        fail("the forward output does not require grad, so nothing can flow back to the shard",
             rank=rank, hint="return the output of FSDPLinearFunction.apply(x, self.shard, "
             "...) as it is: no .detach(), no torch.no_grad() around the forward")
    names = [k for k, _ in res["backward"]]
    if "all_reduce" in names:
        fail(f"the backward made these collective calls: {names}", rank=rank, hint=ALL_REDUCE)
    if res["kept"]:
        fail(f"after backward the layer still references {', '.join(res['kept'])}",
             rank=rank, hint=KEPT)
    if not close(res["grad_x"], ref["grad_x"][rank]):
        fail("the input gradient differs from u_r W", rank=rank,
             hint="backward returns grad_y @ W for x, with the full W gathered again")
    got, grad = res["grad"], ref["grad"]
    if got is None or not close(got, grad[mine]):
        hint = "reduce-scatter the flat gradient [vec dW; db] and divide by d (DDP averages)"
        if got is not None and close(got, d * grad[mine]):
            hint = "your gradient is d times DDP's: the reduce-scatter sums; divide by d"
        elif got is None:
            hint = "backward must return the shard's gradient as its second output"
        fail("the shard's gradient differs from DDP's averaged gradient", rank=rank, hint=hint)
    if not close(res["after"], ref["flat"][mine] - LR * grad[mine]):
        fail("after an SGD step the shard differs from DDP's", rank=rank, hint="the gradient "
             "was right, so the optimizer updated something else: the layer's only parameter "
             "must be the shard, the one tensor the forward gathers from")


def _check_bytes(res: dict, model: float, rank: int) -> None:
    sent = sum(b for _, b in res["forward"] + res["backward"])
    if abs(sent - model) > 1e-6 * model:
        hint = ("the backward reused the weight gathered in forward (2(d-1)/d * 4P: "
                "reshard_after_forward=False); save only the shard in ctx and all-gather "
                "again in backward") if abs(sent - model * 2 / 3) < 1e-6 * model else \
            "one all-gather in forward, one in backward, one reduce-scatter of the gradient"
        fail(f"the layer sent {sent:,.0f} B in one step, expected 3(d-1)/d * 4P = "
             f"{model:,.0f} B", rank=rank, hint=hint)


def _reference(d: int, in_f: int, out_f: int) -> dict:
    linear, xs, ups = _problem(d, in_f, out_f)
    flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
    loss = sum((linear(x) * u).sum() for x, u in zip(xs, ups, strict=True)) / d
    loss.backward()
    if linear.weight.grad is None or linear.bias.grad is None:  # pragma: no cover
        raise RuntimeError("the reference nn.Linear got no gradient")
    return {"flat": flat, "n": flat.numel() // d,
            "grad": torch.cat([linear.weight.grad.flatten(), linear.bias.grad]),
            "y": [linear(x).detach() for x in xs],
            "grad_x": [u @ linear.weight.detach() for u in ups]}


@harness.exercise("fsdp_layer", needs={
    "fsdp_shards": "take_shard, all_gather_flat and reduce_scatter_flat (the first test of "
                   "exercise 2)"})
def check_fsdp_layer(cls: Callable[..., Any], *, world_size: int = 2, in_features: int = 8,
                     out_features: int = 8, timeout: float = harness.CHECK_TIMEOUT_S,
                     quiet: bool = False) -> dict:
    """FSDPLinear(linear) on `world_size` ranks against a DDP step (see the module docstring).
    Returns rank 0's measured bytes and the model's: {"t", "P", "measured", "model"}."""
    d, p = world_size, out_features * (in_features + 1)
    if p % d:
        raise ValueError(f"P = {p} must be a multiple of world_size = {d}")
    not_fsdp(cls, "FSDPLinear")
    results = harness.run_checked(
        _worker, d, cls, in_features, out_features, what="the FSDP layer", timeout=timeout,
        hang_hint="every rank must make the same collective calls in the same order: one "
        "all-gather in forward, an all-gather and a reduce-scatter in backward")
    ref, model = _reference(d, in_features, out_features), 3 * (d - 1) / d * p * 4
    for rank, res in enumerate(results):
        _check_step(res, ref, rank, d)
        _check_bytes(res, model, rank)
    sent0 = sum(b for _, b in results[0]["forward"] + results[0]["backward"])
    if not quiet:
        print(f"FSDPLinear on {d} ranks (nn.Linear({in_features}, {out_features}), P = {p}): "
              f"shards, output, gradients and an SGD step match DDP; {sent0:,.0f} B sent per "
              "rank = 3(d-1)/d * 4P. Passed.")
    return {"t": d, "P": p, "measured": sent0, "model": model}
