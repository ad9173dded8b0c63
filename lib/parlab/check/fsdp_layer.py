r"""Exercise 2 of module 01: an FSDP-style linear layer against a single-device DDP step.

Sizes: nn.Linear(8, 8) in float32, P = 64 + 8 = 72 parameters, flattened as [vec W; b];
rank r keeps elements [r n, (r+1) n) with n = P / t (t = 2 or 4: no padding). Each rank feeds
its own N = 3 rows x_r and backpropagates sum(y_r * u_r) for its own upstream u_r.

Reference (in the parent, plain torch): the single-device layer with DDP's averaged gradient
$\bar g = \frac{1}{t}\sum_q \nabla_\theta \mathrm{sum}(y_q u_q)$, one SGD step
$\theta \leftarrow \theta - 0.1\,\bar g$. Rank r must hold: its output $y_r$ and input gradient
$u_r W$ (tolerance 1e-5 relative, 1e-6 absolute: float32, summation order only); its shard of
$\bar g$ and of the updated $\theta$; nothing of the gathered $\theta$ still referenced by the
layer after backward; and the bytes $3\frac{t-1}{t}\cdot 4P$ (all-gather in forward, all-gather
again in backward, reduce-scatter of the gradient).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parlab.check import CHECK_TIMEOUT_S, fail, refuse_in_rank, run_checked
from parlab.check import call_learner as _call
from parlab.check.sp.common import HANG
from parlab.check.sp.common import reject_reference as _reject_reference
from parlab.check.tp.common import cpu as _cpu
from parlab.check.tp.common import env as _env
from parlab.check.tp.compare import close as _close

_run = functools.partial(run_checked, hang_hint=HANG)

IN, OUT, N, LR, SEED = 8, 8, 3, 0.1, 1234
P = OUT * IN + OUT
_KIND = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}
ALL_REDUCE = ("the gradients were all-reduced instead of reduce-scattered: an all-reduce sends "
              "2(t-1)/t of the gradient per rank and leaves every rank the whole sum, of which it "
              "keeps 1/t; dist.reduce_scatter sends (t-1)/t and leaves rank r its own shard")
OFFSET = "rank r's shard is elements r*n:(r+1)*n of the flat [vec W; b], n = P/t"
KEPT = ("the gathered weight is kept after backward: FSDP frees the full parameters once a "
        "layer's backward is done (only the shard lives between steps); do not store the "
        "gathered tensor on the module")


def _problem(t: int) -> tuple[nn.Linear, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(SEED)
    linear = nn.Linear(IN, OUT)
    xs = [torch.randn(N, IN, generator=torch.Generator().manual_seed(100 + q)) for q in range(t)]
    ups = [torch.randn(N, OUT, generator=torch.Generator().manual_seed(200 + q))
           for q in range(t)]
    return linear, xs, ups


def _guard() -> None:
    """Refuse parlab's reference FSDP layer in this rank (aliases, wrappers and subclasses)."""
    from parlab.dp import fsdp

    refuse_in_rank([fsdp.take_shard, fsdp.gather_flat_params, fsdp.reduce_scatter_flat_grads,
                    fsdp._FSDPLinearFn, fsdp.FSDPLinear], "parlab.dp.fsdp")


def _traced(stage: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple]]:
    from parlab import comm

    with comm.trace() as tr:
        out = _call(stage, fn, *args, hint="read the error above; the flat parameter is "
                    "[vec W; b], (P,), and each rank's shard is (P/t,)")
    return out, [(_KIND.get(e.kind, e.kind), e.wire_bytes) for e in tr.events]


def _kept(obj: Any, params: set[int], depth: int = 0) -> list[str]:
    """Tensors of at least P elements reachable from the layer's attributes, except params."""
    found: list[str] = []
    items = (vars(obj).items() if hasattr(obj, "__dict__") and depth == 0
             else obj.items() if isinstance(obj, dict)
             else enumerate(obj) if isinstance(obj, (list, tuple)) else ())
    for key, value in items:
        if isinstance(value, torch.Tensor):
            if value.numel() >= P and id(value) not in params:
                found.append(f"{key}: {tuple(value.shape)}")
        elif depth < 3 and isinstance(value, (dict, list, tuple)):
            found += _kept(value, params, depth + 1)
    return found


def _worker(cls: Callable[..., Any]) -> dict:
    rank, t, dev = _env()
    _guard()
    linear, xs, ups = _problem(t)
    layer = _call("FSDPLinear(linear)", cls, copy.deepcopy(linear))
    params = list(layer.parameters())
    out: dict[str, Any] = {"numel": sum(p.numel() for p in params),
                           "shard": _cpu(torch.cat([p.detach().flatten() for p in params]))
                           if params else None}
    x = xs[rank].clone().requires_grad_()
    y, out["forward"] = _traced("FSDPLinear.forward", layer, x)
    out["y"] = _cpu(y)
    if not isinstance(y, torch.Tensor) or y.shape != (N, OUT) or not y.requires_grad:
        return out
    _, out["backward"] = _traced("the backward pass", (y * ups[rank]).sum().backward)
    out["kept"] = _kept(layer, {id(p) for p in params})
    out["grad_x"] = _cpu(x.grad)
    grads = [p.grad for p in params]
    out["grad"] = _cpu(torch.cat([g.flatten() for g in grads])) \
        if grads and all(g is not None for g in grads) else None
    if out["grad"] is not None:
        torch.optim.SGD(params, lr=LR).step()
        out["after"] = _cpu(torch.cat([p.detach().flatten() for p in params]))
    return out


def _shard_story(got: torch.Tensor, flat: torch.Tensor, rank: int, t: int) -> str:
    n = P // t
    for off in range(P - n + 1):
        if got.shape == (n,) and torch.equal(got, flat[off:off + n]):
            return f"your shard starts at element {off}; rank {rank}'s starts at {rank * n}. "
    if got.shape == (n,) and torch.equal(got, flat[rank::t]):
        return "your shard takes every t-th element (a strided shard). "
    return ""


def check_fsdp_layer(cls: Callable[..., Any], *, world_size: int = 2,
                     timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> dict:
    """FSDPLinear(linear) on `world_size` ranks against a DDP step (see the module docstring).
    Returns rank 0's measured bytes and the model's: {"t", "P", "measured", "model"}."""
    _reject_reference(cls, "FSDPLinear")
    t, n = world_size, P // world_size
    results = _run(_worker, t, cls, what="the FSDP layer", timeout=timeout)
    linear, xs, ups = _problem(t)
    flat = torch.cat([linear.weight.detach().flatten(), linear.bias.detach()])
    loss = sum((linear(x) * u).sum() for x, u in zip(xs, ups, strict=True)) / t
    loss.backward()
    grad = torch.cat([linear.weight.grad.flatten(), linear.bias.grad])
    model = 3 * (t - 1) / t * P * 4
    for rank, res in enumerate(results):
        mine = slice(rank * n, (rank + 1) * n)
        if res["numel"] != n:
            fail(f"the layer holds {res['numel']} parameter elements, expected its shard of "
                 f"{P}/{t} = {n}", rank=rank, hint="each rank keeps one nn.Parameter, its shard "
                 "(P/t,): the whole weight must not be a parameter of the layer")
        if not torch.equal(res["shard"], flat[mine]):
            fail("the shard holds the wrong elements of the flat parameter", rank=rank,
                 hint=_shard_story(res["shard"], flat, rank, t) + OFFSET)
    for rank, res in enumerate(results):  # every rank's shard first: rank 0's may be right
        mine = slice(rank * n, (rank + 1) * n)
        kinds = [k for k, _ in res["forward"]]
        if not kinds or set(kinds) != {"all_gather"}:
            fail(f"the forward made these collective calls: {kinds or 'none'}; expected "
                 "all-gathers only", rank=rank, hint="forward all-gathers the shards into the "
                 "flat parameter (dist.all_gather, then torch.cat)")
        y_ref = linear(xs[rank]).detach()
        if not _close(res["y"], y_ref, rtol=1e-5, atol=1e-6):
            fail(f"the forward output {tuple(getattr(res['y'], 'shape', ()))} differs from "
                 "x W^T + b", rank=rank, hint="unflatten the gathered vector as W = "
                 "flat[:out*in].view(out, in), b = flat[out*in:]")
        kinds = [k for k, _ in res["backward"]]
        if "all_reduce" in kinds:
            fail(f"the backward made these collective calls: {kinds}", rank=rank,
                 hint=ALL_REDUCE)
        if res["kept"]:
            fail(f"after backward the layer still references {', '.join(res['kept'])}",
                 rank=rank, hint=KEPT)
        if not _close(res["grad_x"], ups[rank] @ linear.weight.detach(), rtol=1e-5, atol=1e-6):
            fail("the input gradient differs from u_r W", rank=rank,
                 hint="backward returns grad_y @ W for x, with the full W")
        got = res["grad"]
        if got is None or not _close(got, grad[mine], rtol=1e-5, atol=1e-6):
            hint = "reduce-scatter the flat gradient [vec dW; db] and divide by t (DDP averages)"
            if got is not None and _close(got, t * grad[mine], rtol=1e-5, atol=1e-6):
                hint = "your gradient is t times DDP's: the reduce-scatter sums; divide by t"
            fail("the shard's gradient differs from DDP's averaged gradient", rank=rank,
                 hint=hint)
        if not _close(res["after"], flat[mine] - LR * grad[mine], rtol=1e-5, atol=1e-6):
            fail("after an SGD step the shard differs from DDP's", rank=rank)
        sent = sum(b for _, b in res["forward"] + res["backward"])
        if abs(sent - model) > 1e-6 * model:
            hint = ("the backward reused the weight gathered in forward (2(t-1)/t P: "
                    "reshard_after_forward=False); save only the shard in ctx and all-gather "
                    "again in backward") if abs(sent - model * 2 / 3) < 1e-6 * model else \
                "one all-gather in forward, one in backward, one reduce-scatter of the gradient"
            fail(f"the layer sent {sent:,.0f} B in one step, expected 3(t-1)/t * 4P = "
                 f"{model:,.0f} B", rank=rank, hint=hint)
    sent0 = sum(b for _, b in results[0]["forward"] + results[0]["backward"])
    if not quiet:
        print(f"FSDPLinear on {t} ranks: shards, output, gradients and an SGD step match DDP; "
              f"{sent0:,.0f} B sent per rank = 3(t-1)/t * 4P. Passed.")
    return {"t": t, "P": P, "measured": sent0, "model": model}
