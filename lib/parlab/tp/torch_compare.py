r"""Module 02's and 03's tensor parallelism twice on the same weights, in one rank: built from
the course's (or a learner's) classes, and with PyTorch's API, each step traced part by part.

- `tp_sides(vocab, hidden, heads, layers, yours, plan, loss)`: a FusedLM through
  `MegatronLM` (the classes and functions of `yours`: embed, block, f, cross_entropy) and its
  SplitLM through `plan(model, mesh)` and `loss(logits, target)` (the loss runs its backward,
  as `loss_parallel` needs); the same ids and targets. Returns each side's calls, loss, this
  rank's columns of the logits, and the one-device loss; `more` runs other plans beside
  (module 02 draws the plan without PrepareModuleInput).
- `sp_sides(hidden, heads, tokens, yours, plan)`: one layer under TP + SP: `yours(block)`
  (module 03's SPBlock: forward(x, generator), `reduce_replicated_grads()`) against a
  SplitBlock through `plan(block, mesh)`, on this rank's tokens, without dropout. The
  gradients of the parameters every rank holds whole are read at the end, as an optimizer
  would read them: your `reduce_replicated_grads()`, DTensor's `full_tensor()` of a Partial
  gradient; their all-reduces are the part "replicated grads". Your layer's calls are
  labelled by their order (into and out of attention, then the MLP; the reverse in backward),
  PyTorch's by the module that made them.

Both return plain data, for `parlab.launch.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parlab.tp.torch_measure import Call, MegatronLM, Regions, lm_regions, traced_step

__all__ = ["tp_sides", "sp_sides", "label_sp"]


def _ids(vocab: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, seq), generator=g),
            torch.randint(0, vocab, (batch, seq), generator=g))


def tp_sides(vocab: int, hidden: int, heads: int, layers: int, *, yours: dict[str, Any],
             plan: Callable[..., Any], loss: Callable[..., Any], batch: int = 2, seq: int = 5,
             seed: int = 0, more: dict[str, Callable[..., Any]] | None = None) -> dict:
    """One training step both ways on this rank (module docstring); `more`: other plans
    (name -> plan(model, mesh)) run on their own copy with `loss`, their calls under "more"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from parlab.launch import device
    from parlab.tp.torch_model import make_lm

    dev = device()
    lm, split = make_lm(vocab, hidden, heads, layers, seed=seed, device=dev)
    idx, target = (x.to(dev) for x in _ids(vocab, batch, seq, seed))
    with torch.no_grad():
        one = float(F.cross_entropy(lm(idx).flatten(0, 1), target.flatten()))
    mine = MegatronLM(lm, **yours)
    y1, l1, c1 = traced_step(mine, idx, lambda out: mine.loss(out, target), lm_regions(mine))
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    theirs = plan(split, mesh)
    y2, l2, c2 = traced_step(theirs, idx, lambda out: loss(out, target), lm_regions(theirs))
    local = y2.to_local() if isinstance(y2, DTensor) else y2
    l2 = l2.to_local() if isinstance(l2, DTensor) else l2
    extra = {}
    for name, other in (more or {}).items():
        model = other(make_lm(vocab, hidden, heads, layers, seed=seed, device=dev)[1], mesh)
        extra[name] = traced_step(model, idx, lambda out: loss(out, target),
                                  lm_regions(model))[2]
    return {"yours": c1, "PyTorch": c2, "more": extra,
            "loss": (float(l1.detach()), float(l2.detach()), one),
            "columns": (tuple(y1.shape), tuple(local.shape)),
            "logits": (y1.detach().cpu(), local.detach().cpu())}


def label_sp(calls: list[Call]) -> list[Call]:
    """An SP layer's unlabelled calls named by their order: in forward the first half
    attention's, the second the MLP's; in backward the reverse (a layer makes as many calls
    for each, its gather-ins, reduce-scatters and any re-gather alike)."""
    parts = {"forward": ("attention", "MLP"), "backward": ("MLP", "attention")}
    counts = {p: sum(c.region == "other" and c.phase == p for c in calls) for p in parts}
    seen = dict.fromkeys(parts, 0)
    out = []
    for c in calls:
        if c.region != "other" or c.phase not in parts:
            out.append(c)
            continue
        first, second = parts[c.phase]
        name = first if seen[c.phase] < counts[c.phase] / 2 else second
        seen[c.phase] += 1
        out.append(Call(name, c.phase, c.kind, c.nbytes, c.wire))
    return out


def _yours_step(make: Callable[[Any], Any], block: Any, x: torch.Tensor, up: torch.Tensor,
                seed: int) -> tuple[list[Call], torch.Tensor, torch.Tensor]:
    """A layer like module 03's SPBlock (forward(x, generator); the replicated gradients
    summed by `reduce_replicated_grads()`, or parlab's `allreduce_sequence_parallel_grads()`):
    its calls labelled by order, its output and its input's gradient."""
    mine = make(block)
    with Regions({}) as seen:
        leaf = x.clone().requires_grad_()
        y = mine(leaf, torch.Generator().manual_seed(seed))
        (y * up).sum().backward()
        with seen.loss():
            if hasattr(mine, "reduce_replicated_grads"):
                mine.reduce_replicated_grads()
            else:
                mine.allreduce_sequence_parallel_grads()
    calls = [Call("replicated grads", "after", c.kind, c.nbytes, c.wire)
             if c.region == "loss" else c for c in label_sp(seen.calls)]
    return calls, y.detach().cpu(), _grad(leaf)


def sp_sides(hidden: int, heads: int, tokens: int, *, yours: Callable[[Any], Any],
             plan: Callable[..., Any], batch: int = 2, seed: int = 0,
             more: dict[str, Callable[[Any], Any]] | None = None) -> dict:
    """One layer under TP + SP both ways on this rank (module docstring); `more`: other layers
    made like yours (name -> make(block)), their calls under "more"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from parlab.launch import device
    from parlab.tp.block import DropoutBlock
    from parlab.tp.torch_model import SplitBlock

    dev, rank, t = device(), dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    block = DropoutBlock(hidden, heads, p_drop=0.0).to(dev)
    g = torch.Generator().manual_seed(seed)
    x, up = (torch.randn(batch, tokens, hidden, generator=g).to(dev) for _ in range(2))
    n = tokens // t
    x, up = x[:, rank * n:(rank + 1) * n], up[:, rank * n:(rank + 1) * n]
    calls, y, dx = _yours_step(yours, block, x, up, seed)
    out: dict[str, Any] = {"yours": calls, "y": [y], "x.grad": [dx],
                           "more": {name: _yours_step(make, block, x, up, seed)[0]
                                    for name, make in (more or {}).items()}}
    mesh = init_device_mesh(dev.type, (t,))
    theirs = plan(SplitBlock.from_block(block), mesh)
    with Regions({"attention": theirs.attn, "MLP": theirs.mlp}) as seen:
        leaf = x.clone().requires_grad_()
        y = theirs(leaf)
        (y * up).sum().backward()
        with seen.loss():
            for p in theirs.parameters():
                if isinstance(p.grad, DTensor) and p.grad.placements[0].is_partial():
                    p.grad.full_tensor()
    out["PyTorch"] = [Call("replicated grads", "after", c.kind, c.nbytes, c.wire)
                      if c.region == "loss" else c for c in seen.calls]
    out["y"].append(y.detach().cpu())
    out["x.grad"].append(_grad(leaf))
    return out


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    if leaf.grad is None:
        raise RuntimeError("the input got no gradient: the layer cut it from the graph")
    return leaf.grad.detach().cpu()
