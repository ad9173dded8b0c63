r"""Shared machinery of the module-02 checks (`parlab.check.tp`, `parlab.check.tp_layers`).

In the ranks: `_env` (rank, t, device: a GPU per rank under NCCL), `_guard` (parlab's own TP
classes raise CheckFailed), `_call` (learner code; a crash becomes CheckFailed saying where),
`_traced` (collectives counted by parlab.comm), `_backward` (loss = sum(y * upstream)).
In the parent: `_run` (ranks, with hangs and in-rank CheckFailed turned into CheckFailed),
`_compare` (rank by rank, with a guess at the mistake when a gradient is off), `_expect_events`.
Constants: the tolerances and sizes of the checks and the likely-mistake sentences.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from parlab.check import (
    assert_close,
    call_learner,
    fail,
    not_reference,
    refuse_in_rank,
    run_checked,
)

F64_TOL = {"rtol": 1e-10, "atol": 1e-12}
F32_TOL = {"rtol": 1e-5, "atol": 1e-6}
B, S, H, HEADS = 2, 5, 16, 4  # batch, sequence, hidden, attention heads of the float32 checks
SEED = 1234
F_BACKWARD = ("f's backward must all-reduce: each rank's column shard adds only its own part "
              "of dL/dx, and the true gradient is the sum over ranks")
G_BACKWARD = ("g's backward must be the identity: g's output is the same on every rank, so "
              "every rank already holds the whole gradient; an all-reduce there sums t copies")
BIAS_ONCE = ("the bias is added on every rank before the all-reduce, so it is counted t times: "
             "add it once, after the all-reduce")
ROW_FIRST = ("row-parallel first needs an all-reduce before the GeLU (GeLU of partial sums is "
             "not GeLU of the sum) and another collective after fc2: make fc1 column-parallel "
             "and fc2 row-parallel, which needs one all-reduce in forward and one in backward")
LINEAR_LAYOUT = ("nn.Linear.weight has shape (out_features, in_features): the column-parallel "
                 "layer keeps a block of ROWS of linear.weight (dim 0, its output features) and "
                 "the row-parallel layer a block of its COLUMNS (dim 1, its input features)")


# --- in the ranks ------------------------------------------------------------------------------

def _env() -> tuple[int, int, torch.device]:
    import torch.distributed as dist

    dev = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
           else torch.device("cpu"))
    return dist.get_rank(), dist.get_world_size(), dev


def _guard() -> None:
    """Refuse parlab's reference TP code in this rank (aliases, wrappers and subclasses too)."""
    from parlab.tp import attention, layers, mappings

    refuse_in_rank([mappings._CopyToTPRegion, mappings._ReduceFromTPRegion,
                    mappings._GatherFromTPRegion, mappings._ScatterToTPRegion,
                    layers.ColumnParallelLinear, layers.RowParallelLinear, layers.TPMLP,
                    attention.TPAttention, attention.TPBlock, attention.heads_first_qkv],
                   "parlab.tp")


def _call(stage: str, fn: Callable[..., Any], *args: Any, hint: str | None = None) -> Any:
    """Run learner code; a crash becomes CheckFailed saying where (stubs raise as they are)."""
    return call_learner(stage, fn, *args, hint=hint, shape_hint=LINEAR_LAYOUT)


def _traced(stage: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[tuple]]:
    from parlab import comm

    with comm.trace() as tr:
        out = _call(stage, fn, *args)
    return out, [(e.kind, tuple(e.shape), e.wire_bytes) for e in tr.events]


def _cpu(x: Any) -> Any:
    return x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x


def _param(module: Any, path: str, rank: int) -> torch.nn.Parameter:
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor):
        fail(f"{type(module).__name__} has no tensor attribute {path}", rank=rank,
             hint=f"keep the names of the skeleton: the check compares the gradient of {path}")
    return obj


def _grads(module: Any, paths: tuple[str, ...], rank: int) -> dict[str, Any]:
    found = {p: _param(module, p, rank) for p in paths}
    return {p: (_cpu(v), _cpu(v.grad)) for p, v in found.items()}


REPLICATED = "return the whole output, replicated on every rank"


def _backward(stage: str, y: Any, upstream: torch.Tensor, rank: int, hint: str = REPLICATED,
              traced: Callable[..., tuple[Any, list[tuple]]] | None = None) -> list[tuple]:
    """Backward of sum(y * upstream), traced (by `traced`, default `_traced`); y must be a
    tensor of upstream's shape with an autograd graph (`hint` says what the shape should be)."""
    if not isinstance(y, torch.Tensor) or y.shape != upstream.shape:
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        fail(f"{stage} returned {got}, expected a tensor of shape {tuple(upstream.shape)}",
             rank=rank, hint=hint)
    if not y.requires_grad:
        fail(f"{stage} returned a tensor with no autograd graph", rank=rank,
             hint="call your autograd Function as MyFunction.apply(x), not .forward, and do "
                  "not detach")
    return (traced or _traced)(f"the backward pass of {stage}", (y * upstream).sum().backward)[1]


# --- in the parent -----------------------------------------------------------------------------

def _reject_reference(obj: Any, name: str) -> None:
    not_reference(obj, name=name, modules=("parlab.tp",),
                  advice=" (subclass nn.Module or torch.autograd.Function)")


HANG = ("a collective that only some ranks call (inside `if rank == ...`), or ranks calling "
        "different collectives: every rank must make the same calls in the same order")
_run = functools.partial(run_checked, hang_hint=HANG)


def _close(got: Any, ref: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == ref.shape
            and bool(torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol)))


def _scale(got: Any, ref: torch.Tensor) -> float | None:
    """c when got is c * ref, else None."""
    if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
        return None
    r, g = ref.double().flatten(), got.double().flatten()
    if float(r @ r) == 0:
        return None
    c = float(g @ r / (r @ r))
    return c if _close(got, c * ref) else None


def _times(got: Any, ref: torch.Tensor) -> float | None:
    """c when got is c * ref with c not 1, else None."""
    c = _scale(got, ref)
    return c if c is not None and abs(c - 1) > 1e-3 else None


def _bias_counted(y: Any, ref: torch.Tensor, bias: torch.Tensor, t: int) -> bool:
    """y = ref + (t - 1) * bias: the bias was added on every rank before the all-reduce."""
    if t == 1 or not isinstance(y, torch.Tensor) or y.shape != ref.shape:
        return False
    c = _scale(y - ref, bias.expand_as(ref))
    return c is not None and abs(c - (t - 1)) < 1e-3


def _grad_hint(name: str, rank: int, results: list, key: Callable[[dict], Any],
               ref: Callable[[dict], torch.Tensor], t: int) -> str | None:
    """Why one gradient is wrong, guessed from all ranks' values."""
    got, want = key(results[rank]), ref(results[rank])
    if got is None:
        return (f"{name} is None: no gradient reached it (is something detached, or does a "
                "backward return None?)")
    c = _times(got, want)
    if c is not None and abs(c - t) < 1e-3:
        return f"{name} is t = {t} times the reference: {G_BACKWARD}"
    if name.startswith("grad of x"):
        parts = [key(r) for r in results]
        if all(isinstance(p, torch.Tensor) for p in parts) and _close(sum(parts), want):
            return f"the ranks' {name} add up to the reference: {F_BACKWARD}"
    if c is not None:
        return f"{name} is {c:.4g} times the reference"
    return None


def _compare(results: list, t: int, checks: list[tuple], tol: dict,
             hint: str | None = None) -> None:
    """checks: (name, got(result), expected(result)) compared on every rank, in order."""
    for name, got, want in checks:
        for rank, res in enumerate(results):
            g, w = got(res), want(res)
            if g is None or not _close(g, w, **tol):
                why = _grad_hint(name, rank, results, got, want, t) \
                    if name.startswith("grad") else None
                if g is None:
                    fail(f"{name} is None, expected a tensor of shape {tuple(w.shape)}",
                         rank=rank, hint=why or hint)
                assert_close(g, w, name=name, rank=rank, hint=why or hint, **tol)


def _kinds(events: list[tuple]) -> str:
    return ", ".join(f"{k} {tuple(s)}" for k, s, _ in events) or "none"


def _expect_events(results: list, phase: str, where: str, want: list[str],
                   hint: Callable[[list[tuple]], str]) -> None:
    for rank, res in enumerate(results):
        got = [k for k, _, _ in res[phase]]
        if got != want:
            fail(f"the {phase.replace('_', ' ')} of {where} made these collective calls: "
                 f"{_kinds(res[phase])}; expected {', '.join(want) or 'none'}", rank=rank,
                 hint=hint(res[phase]))


def _mlp_setup(seed: int, dev: torch.device) -> tuple:
    from parlab.model.transformer import MLP

    torch.manual_seed(seed)
    mlp = MLP(H).to(dev)
    x = torch.randn(B, S, H, device=dev)
    up = torch.randn(B, S, H, device=dev)
    xr = x.clone().requires_grad_()
    y = mlp(xr)
    (y * up).sum().backward()
    ref = {"y": _cpu(y), "x.grad": _cpu(xr.grad)}
    ref.update({f"{n}": _cpu(p) for n, p in mlp.named_parameters()})
    ref.update({f"{n}.grad": _cpu(p.grad) for n, p in mlp.named_parameters()})
    mlp.zero_grad(set_to_none=True)
    return mlp, x, up, ref


def _mlp_shards(t: int) -> list[tuple]:
    """(param, slice of the reference) for fc1 column-parallel and fc2 row-parallel."""
    def rows(r: dict, p: str) -> torch.Tensor:
        n = r["ref"][p].shape[0] // t
        return r["ref"][p][r["rank"] * n:(r["rank"] + 1) * n]

    def cols(r: dict, p: str) -> torch.Tensor:
        n = r["ref"][p].shape[1] // t
        return r["ref"][p][:, r["rank"] * n:(r["rank"] + 1) * n]

    return [("fc1.weight", rows), ("fc1.bias", rows), ("fc2.weight", cols),
            ("fc2.bias", lambda r, p: r["ref"][p])]


def _shard_story(kind: str, got: torch.Tensor, full: torch.Tensor, rank: int, t: int) -> str:
    dim = 0 if kind == "column" else 1
    for q in range(t):
        if q != rank and got.shape == full.chunk(t, dim)[q].shape and \
                torch.equal(got, full.chunk(t, dim)[q]):
            return f"it holds rank {q}'s shard: rank r keeps block r of {t}"
    return f"rank r keeps block r of {t} along dim {dim} of linear.weight; " + LINEAR_LAYOUT
