r"""What the checks of PyTorch's tensor-parallel API share (module 02's exercise 9, module 03's
exercise 6): the layout a right plan gives each parameter, the reference pieces, the in-rank
helpers.

- `layout(name)`: the placement a parameter of a SplitLM / SplitBlock must have: "Shard(0)"
  (q, k, v, fc1, the head, the embedding: rows), "Shard(1)" (proj and fc2: columns),
  "Replicate()" (their biases), None for a LayerNorm (any whole copy, plain or Replicate);
  `sp_layout(name)` the same under TP + SP, where the LayerNorms must be Replicate() DTensors.
- `piece(full, placement, rank, t)`: a rank's part of a whole tensor under a placement, as
  DTensor cuts it (torch.chunk: ⌈R/t⌉ rows each, the last ranks fewer or none).
- `split_reference(lm)`: a FusedLM's parameters and gradients under the SplitLM's names (q, k
  and v are rows [0, C), [C, 2C), [2C, 3C) of the fused qkv).
- `layout_problem(params, n_heads, t, heads)`: the first way the parameters are not as a
  right plan leaves them, as (message, hint), else None: run in the rank, before anything
  crashes on it, and in the checking process, on the data the ranks sent.
- `call_api(stage, fn, *args)`: the learner's call, a crash named with the likely mistake that
  its words point to (`torch_hints.error_hint`), through `call_learner`.
- `hide_unowned(module, names, rank, t)`: under the verifier (`learner_mode`), every entry of a
  sharded weight that rank r > 0 does not own set to NaN. `parallelize_module` scatters each
  weight from rank 0 (distribute_tensor's src_data_rank=0), so rank 0 holds the whole model,
  as on the job a rank that loads a checkpoint does; the others are never read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from parlab.check._compare import assert_close, fail
from parlab.check._harness import call_learner
from parlab.check.tp import torch_hints as H
from parlab.dp.fsdp2 import dim0_rows

__all__ = ["layout", "sp_layout", "piece", "split_reference", "layout_problem", "call_api",
           "hide_unowned", "about", "placement", "check_grads", "fail_layout", "tol"]

_RULES = [(r"(^|\.)tok\.weight$", "Shard(0)"), (r"\.attn\.[qkv]\.(weight|bias)$", "Shard(0)"),
          (r"\.attn\.proj\.weight$", "Shard(1)"), (r"\.attn\.proj\.bias$", "Replicate()"),
          (r"\.mlp\.fc1\.(weight|bias)$", "Shard(0)"), (r"\.mlp\.fc2\.weight$", "Shard(1)"),
          (r"\.mlp\.fc2\.bias$", "Replicate()"), (r"(^|\.)head\.weight$", "Shard(0)")]


def layout(name: str) -> str | None:
    """The placement a right TP plan gives parameter `name` (see the module docstring)."""
    dotted = "." + name
    return next((p for pattern, p in _RULES if re.search(pattern, dotted)), None)


def sp_layout(name: str) -> str | None:
    """The placement a right TP + SP plan gives `name`: TP's, and the LayerNorms Replicate()
    DTensors (SequenceParallel makes them so: their gradients then sum over the ranks)."""
    if re.search(r"(^|\.)ln[12_f]*\.(weight|bias)$", name):
        return "Replicate()"
    return layout(name)



def placement(p: Any) -> str:
    """'Shard(0)', 'Replicate()', or torch's own words for another placement."""
    return f"Shard({p.dim})" if p.is_shard() else "Replicate()" if p.is_replicate() else repr(p)


def about(t: Any) -> dict:
    """A parameter, gradient or output as plain data: kind, placements, global shape, the
    ranks of its mesh and this rank's local piece (detached, on the CPU)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return {"kind": "DTensor", "placements": [placement(p) for p in t.placements],
                "mesh": [int(r) for r in t.device_mesh.mesh.flatten().tolist()],
                "shape": list(t.shape), "local": t.to_local().detach().cpu().clone()}
    if isinstance(t, torch.Tensor):
        return {"kind": "Tensor", "shape": list(t.shape), "local": t.detach().cpu().clone()}
    return {"kind": type(t).__name__}


def piece(full: torch.Tensor, where: str | None, rank: int, t: int) -> torch.Tensor:
    """Rank `rank`'s part of `full` under placement `where` ("Shard(d)"; anything else: all)."""
    match = re.fullmatch(r"Shard\((-?\d+)\)", where or "")
    if not match:
        return full
    dim = int(match.group(1)) % full.dim()
    start, end = dim0_rows(full.shape[dim], t)[rank]
    return full.narrow(dim, start, end - start)


def split_reference(lm: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """{SplitLM name: (value, gradient)} from a FusedLM (after its backward)."""
    out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for name, p in lm.named_parameters():
        grad = None if p.grad is None else p.grad.detach()
        if ".attn.qkv." in name:
            c = p.shape[0] // 3
            for j, part in enumerate("qkv"):
                rows = slice(j * c, (j + 1) * c)
                out[name.replace(".qkv.", f".{part}.")] = (
                    p.detach()[rows], None if grad is None else grad[rows])
        else:
            out[name] = (p.detach(), grad)
    return out


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0]


def layout_problem(params: dict[str, dict], n_heads: list[int], t: int, heads: int, *,
                   where: Callable[[str], str | None] = layout,
                   replicated: str = H.PLAN) -> tuple[str, str] | None:
    """(message, hint) for the first parameter whose kind or placement a right plan (`where`:
    `layout` for TP, `sp_layout` for TP + SP) would not give it, or the first attention not
    told its heads per rank; None when all are right. `replicated`: the hint for a
    parameter left a plain tensor where a Replicate() DTensor was due (a LayerNorm under SP)."""
    for name, got in params.items():
        want = where(name)
        if want is None:
            if got["kind"] == "DTensor" and got["placements"] != ["Replicate()"]:
                return (f"{name} is sharded {got['placements']}; a LayerNorm stays whole on "
                        "every rank under TP", H.PLAN)
            continue
        if got["kind"] != "DTensor" and want == "Replicate()" and not layout(name):
            return (f"{name} is a plain tensor: {_module(name)!r} is not in the plan, where it "
                    "should be a Replicate() DTensor", replicated)
        if got["kind"] != "DTensor":
            return (f"{name} is a plain tensor of shape {tuple(got['shape'])}, the whole "
                    f"layer {_module(name)!r} on every rank, where the plan should have "
                    f"sharded it {want}", H.LEFT_OUT)
        if got["placements"] != [want]:
            swapped = {want, *got["placements"]} == {"Shard(0)", "Shard(1)"}
            hint = (H.EMBEDDING_COLS if name.endswith("tok.weight") and swapped else
                    H.SWAPPED if swapped else H.PLAN)
            return f"{name} is sharded {got['placements']}, expected [{want!r}]", hint
        if got["mesh"] != list(range(t)):
            return (f"{name} is sharded over ranks {got['mesh']}, the mesh you were given holds "
                    f"{list(range(t))}", "pass the mesh you were given to parallelize_module")
    for i, n in enumerate(n_heads):
        if n != heads // t:
            return (f"blocks[{i}].attn.n_heads is {n} after your plan, but this rank holds "
                    f"{heads // t} of the {heads} heads (attn.q holds 1/{t} of the features)",
                    H.HEADS)
    return None


def call_api(stage: str, fn: Callable[..., Any], *args: Any, hint: str | None = None,
             by_error: Callable[[str], str | None] = H.error_hint) -> Any:
    """fn(*args) through `call_learner`; a crash's likely mistake is the one its words point
    to (`by_error`: module 02's `torch_hints.error_hint` by default), else `hint`."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - named below, through call_learner
        caught = exc

        def again() -> Any:
            raise caught
        return call_learner(stage, again, hint=by_error(str(exc)) or hint)


def hide_unowned(module: nn.Module, names: Iterable[str], rank: int, t: int) -> None:
    """Set every entry of the parameters `names` that rank `rank` does not own (their
    `layout`) to NaN; rank 0 keeps everything (module docstring)."""
    if rank == 0:
        return
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in names:
            where, p = layout(name), params[name]
            match = re.fullmatch(r"Shard\((\d)\)", where or "")
            if not match:
                continue
            dim = int(match.group(1))
            start, end = dim0_rows(p.shape[dim], t)[rank]
            keep = p.narrow(dim, start, end - start).clone()
            p.fill_(float("nan"))
            p.narrow(dim, start, end - start).copy_(keep)


def tol(*refs: torch.Tensor) -> dict[str, float]:
    """float32's tolerance against the references `refs`: rtol 1e-4, and an atol of 1e-5 of
    their largest entry (summation order moves an entry by a few 1e-7 of the largest it was
    summed with, and a gradient that is 0 in exact arithmetic, as the key bias's, is that
    noise alone; a missing all-reduce or a wrong head width moves entries by a tenth of the
    largest and more)."""
    top = max(float(r.detach().abs().max()) for r in refs)
    return {"rtol": 1e-4, "atol": max(1e-6, 1e-5 * top)}


def check_grads(results: list[dict], params: dict, t: int, *, hint: str, missing: str) -> None:
    """Every gradient against the reference, by its placement: a Shard(d) gradient's local
    piece against the rank's piece, a Replicate (or plain) one against the whole, a Partial
    one's pieces summed over the ranks against the whole (DTensor leaves a LayerNorm's
    gradient under SP pending so, until something reads it). The atol is `tol`'s over every
    gradient: entries are summed with the largest of them."""
    within = tol(*(grad for _, grad in params.values() if grad is not None))
    for name, (_, grad) in params.items():
        partial = []
        for rank, res in enumerate(results):
            g = res["grads"][name]
            if g["kind"] not in ("DTensor", "Tensor"):
                fail(f"{name} has no gradient after the backward", rank=rank, hint=missing)
            where = g.get("placements", ["Replicate()"])[0]
            if where.startswith("Partial"):
                partial.append(g["local"])
                continue
            assert_close(g["local"], piece(grad, where, rank, t), name=f"this rank's "
                         f"gradient of {name} ({where})", rank=rank, hint=hint, **within)
        if partial:
            assert_close(torch.stack(partial).sum(0), grad, name=f"the gradient of {name}, "
                         "its Partial pieces summed over the ranks", rank=None, hint=hint,
                         **within)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def fail_layout(problem: tuple[str, str] | None, rank: int,
                unresolved: list[str] | None = None) -> None:
    """Fail with `problem` (layout_problem's); a layer left replicated while
    parallelize_module warned that a key of the plan named no submodule is that key's doing
    (a wildcard's warning alone, "*.proj" missing in mlp, is not a mistake)."""
    if problem is None:
        return
    if unresolved and problem[1] == H.LEFT_OUT:
        fail(f"{problem[0]}; parallelize_module warned: {unresolved[0]}", rank=rank,
             hint=H.UNRESOLVED)
    fail(problem[0], rank=rank, hint=problem[1])
