r"""What every module-02 check shares: sizes, tolerances and the helpers that run inside the
ranks (the likely-mistake sentences are in `parlab.check.tp.hints`).

In the ranks: `env` (rank, t, device: a GPU per rank under NCCL), `guard` (parlab's own TP
classes raise CheckFailed), `prepare` (both, then `setup`'s reference), `traced` (learner code
through `call_learner`, its collectives counted by parlab.comm), `backward` (loss = sum(y *
upstream), traced), `owns_only` (no parameter is a view of the full weight), `unchanged` (an
input left as it was), `cpu`, `param`, `grads`. The comparisons made in the parent are in
`parlab.check.tp.compare`.

Sizes: every float32 check uses B = 2 sequences of S = 5 tokens, hidden C = 48 and 12 heads,
so t = 2, 3 and 4 all divide the heads and the features (C/t = 24, 16, 12), and an answer that
hard-codes the notebook's example sizes, or assumes t is a power of two, fails.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from parlab.check._compare import assert_owns_only, assert_unchanged, fail, randomize_parameters
from parlab.check._harness import call_learner, cpu, env, refuse_in_rank
from parlab.check.tp.hints import IN_PLACE, LINEAR_LAYOUT, OWN_COPY, REPLICATED

F64_TOL = {"rtol": 1e-10, "atol": 1e-12}
# float32: the randomised layers' values are of order 10, and summing up to 192 products in
# another order moves an entry by up to ~1e-5 absolute (measured: 1e-5 at most); a wrong shard
# or a missing all-reduce moves it by ~1e-1 or more
F32_TOL = {"rtol": 1e-5, "atol": 1e-4}
EXACT = {"rtol": 0.0, "atol": 0.0}
B, S, H, HEADS = 2, 5, 48, 12  # batch, sequence, hidden, attention heads of the float32 checks
SEED = 1234


Events = list[tuple[str, tuple[int, ...], float]]  # (kind, shape, wire bytes) per collective
M = TypeVar("M", bound=torch.nn.Module)


# --- in the ranks ------------------------------------------------------------------------------

def guard() -> None:
    """Refuse parlab's reference TP code in this rank (aliases, wrappers and subclasses too)."""
    from parlab.tp import attention, layers, mappings

    refuse_in_rank([mappings._CopyToTPRegion, mappings._ReduceFromTPRegion,
                    mappings._GatherFromTPRegion, mappings._ScatterToTPRegion,
                    layers.ColumnParallelLinear, layers.RowParallelLinear, layers.TPMLP,
                    attention.TPAttention, attention.TPBlock, attention.heads_first_qkv],
                   "parlab.tp")


def traced(stage: str, fn: Callable[..., Any], *args: Any, shape_hint: str = LINEAR_LAYOUT,
           rename: Mapping[str, str] | None = None,
           hint: str | None = None) -> tuple[Any, Events]:
    """(fn(*args) through call_learner, [(kind, shape, wire bytes), ...] of its collectives);
    `rename` maps tracer kinds (e.g. all_gather_into_tensor -> all_gather); a crash's likely
    mistake is `hint` if given, else `shape_hint` when torch says shapes do not fit."""
    from parlab import comm

    with comm.trace() as tr:
        out = call_learner(stage, fn, *args, hint=hint, shape_hint=shape_hint)
    names = rename or {}
    return out, [(names.get(e.kind, e.kind), tuple(e.shape), e.wire_bytes) for e in tr.events]


def param(module: Any, path: str, rank: int) -> torch.Tensor:
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor):
        fail(f"{type(module).__name__} has no tensor attribute {path}", rank=rank,
             hint=f"keep the names of the skeleton: the check compares the gradient of {path}")
    return obj


def grads(module: Any, paths: tuple[str, ...], rank: int) -> dict[str, Any]:
    """{path: value, path + ".grad": gradient} of the module's parameters, on the CPU."""
    out: dict[str, Any] = {}
    for p in paths:
        value = param(module, p, rank)
        out[p], out[p + ".grad"] = cpu(value), cpu(value.grad)
    return out


def owns_only(module: Any, rank: int, hint: str = OWN_COPY) -> None:
    """No parameter of the learner's module may be a view into a larger storage."""
    if isinstance(module, torch.nn.Module):
        for name, p in module.named_parameters():
            assert_owns_only(p, name=f"{type(module).__name__}.{name}", rank=rank, hint=hint)


def unchanged(before: torch.Tensor, after: torch.Tensor, name: str, rank: int) -> None:
    assert_unchanged(before.detach().cpu(), after, name=name, rank=rank, hint=IN_PLACE)


def nonleaf(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf, input): a copy of x that collects the gradient, and the tensor handed to the
    learner, computed from it, so that an answer changing its input in place (x += ...) is
    not stopped by autograd (it refuses that on a leaf) but seen by `unchanged`."""
    leaf = x.detach().clone().requires_grad_()
    return leaf, leaf * 1.0


def backward(stage: str, y: Any, upstream: torch.Tensor, rank: int, hint: str = REPLICATED,
             shape_hint: str = LINEAR_LAYOUT, rename: Mapping[str, str] | None = None) -> Events:
    """Backward of sum(y * upstream), traced; y must be a tensor of upstream's shape with an
    autograd graph (`hint` says what the shape should be)."""
    if not isinstance(y, torch.Tensor) or y.shape != upstream.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        fail(f"{stage} returned {got}, expected a tensor of shape {tuple(upstream.shape)}",
             rank=rank, hint=hint)
    if not y.requires_grad:
        fail(f"{stage} returned a tensor with no autograd graph", rank=rank,
             hint="call your autograd Function as MyFunction.apply(x), not .forward, and do "
                  "not detach")
    return traced(f"the backward pass of {stage}", (y * upstream).sum().backward,
                  shape_hint=shape_hint, rename=rename)[1]


def learner_mode() -> bool:
    """This rank runs learner code for the grader's verifier (parlab.sandboxed.MODE): it
    computes no reference (the verifier has its own) and hands out only owned shards."""
    import parlab.sandboxed

    return parlab.sandboxed.MODE == "learner"


def _owned(kind: str, shape: torch.Size, rank: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight mask, bias mask) of what rank owns of a Linear's weight (out, in) and bias:
    "column": its block of output rows; "row": its block of input columns and the whole bias;
    "heads": the Q, K and V rows of its heads in a fused (3C, C) weight."""
    out_f, in_f = shape
    w = torch.zeros(shape, dtype=torch.bool)
    b = torch.zeros(out_f, dtype=torch.bool)
    if kind == "column":
        n = out_f // t
        w[rank * n:(rank + 1) * n] = b[rank * n:(rank + 1) * n] = True
    elif kind == "row":
        k = in_f // t
        w[:, rank * k:(rank + 1) * k] = True
        b[:] = True
    else:  # heads
        c = in_f // t
        for j in range(3):
            w[j * in_f + rank * c:j * in_f + (rank + 1) * c] = True
            b[j * in_f + rank * c:j * in_f + (rank + 1) * c] = True
    return w, b


def handed(module: M, layout: Mapping[str, str], rank: int, t: int) -> M:
    """What the learner's class is given: a copy of module; under the verifier
    (`learner_mode`) the module itself with every weight entry this rank does not own set to
    NaN, so an answer that computes with another rank's shard (the whole product, locally)
    gets NaN, not the right numbers. layout: submodule name ("" for module itself) -> "column",
    "row" or "heads" (`_owned`); what it does not name is replicated."""
    if not learner_mode():
        return copy.deepcopy(module)
    with torch.no_grad():
        for name, kind in layout.items():
            linear = module.get_submodule(name) if name else module
            weight: torch.Tensor = linear.weight  # type: ignore[assignment]
            bias: torch.Tensor | None = linear.bias  # type: ignore[assignment]
            w, b = _owned(kind, weight.shape, rank, t)
            weight[~w.to(weight.device)] = float("nan")
            if bias is not None:
                bias[~b.to(bias.device)] = float("nan")
    return module


def setup(make: Callable[[], M], seed: int, dev: torch.device, *,
          hidden: int = H) -> tuple[M, torch.Tensor, torch.Tensor, dict]:
    """The single-device reference: make() with every parameter randomised (LayerNorms and
    biases included, so a default-initialised stand-in cannot match it), an input x and an
    upstream gradient, (B, S, hidden); its output, input gradient, parameters and their
    gradients."""
    torch.manual_seed(seed)
    module = make().to(dev)
    randomize_parameters(module, seed=seed)
    x, up = torch.randn(B, S, hidden, device=dev), torch.randn(B, S, hidden, device=dev)
    if learner_mode():  # the verifier makes the reference on trusted ranks
        return module, x, up, {}
    xr = x.clone().requires_grad_()
    y = module(xr)
    (y * up).sum().backward()
    ref = {"y": cpu(y), "x.grad": cpu(xr.grad)}
    ref.update({n: cpu(p) for n, p in module.named_parameters()})
    ref.update({f"{n}.grad": cpu(p.grad) for n, p in module.named_parameters()})
    module.zero_grad(set_to_none=True)
    return module, x, up, ref


def prepare(make: Callable[[], M], seed: int, *, hidden: int = H
            ) -> tuple[int, int, torch.device, M, torch.Tensor, torch.Tensor, dict]:
    """In a rank: (rank, t, device) and `setup`'s reference (inputs of `hidden` features),
    then parlab's TP classes refused from here on (`guard`)."""
    rank, t, dev = env()
    guard()
    return (rank, t, dev, *setup(make, seed, dev, hidden=hidden))


def run_module(cls: type, module: torch.nn.Module, x: torch.Tensor, up: torch.Tensor,
               rank: int, params: tuple[str, ...],
               shape_hint: Callable[[Any], str] | None = None,
               build_hint: str | None = None) -> dict:
    """Build the learner's cls(module), check its shards own their memory, run forward and
    backward traced on a copy of x, and check x is unchanged. `shape_hint(model)` is the likely
    mistake when torch says shapes do not fit; `build_hint`, if given, that of any crash of
    cls(module). Returns what the parent compares."""
    model = call_learner(f"{cls.__name__}({type(module).__name__.lower()})", cls, module,
                         hint=build_hint, shape_hint=LINEAR_LAYOUT)
    owns_only(model, rank)
    hint = shape_hint(model) if shape_hint else LINEAR_LAYOUT
    leaf, xin = nonleaf(x)
    y, fwd = traced(f"{cls.__name__}.forward", model, xin, shape_hint=hint)
    unchanged(x, xin, f"x (the tensor given to {cls.__name__}.forward)", rank)
    bwd = backward(f"{cls.__name__}.forward", y, up, rank, shape_hint=hint)
    return {"y": cpu(y), "x.grad": cpu(leaf.grad), "forward": fwd,
            "backward": bwd, "rank": rank, **grads(model, params, rank)}
