r"""What PyTorch's tensor-parallel API does on this machine, measured in a rank: the facts modules
02 and 03 state about it, each computed where the notebook states it.

- `tp_facts(vocab, hidden, heads)` (module 02): one SplitBlock's attention under TP with and
  without `PrepareModuleInput` (the collectives of each pass); the head `ColwiseParallel(
  output_layouts=Shard(-1), use_local_output=False)` on a vocabulary t does not divide (the
  columns each rank holds, the loss under `loss_parallel` against F.cross_entropy on the
  whole logits, the collectives of the loss and of its backward); the embedding under
  `RowwiseParallel(input_layouts=Replicate())` (the placement and local shape of its weight
  and of its gradient); and what DTensor says to attention given DTensors (use_local_output=
  False on q, k and v) on a CPU mesh.
- `sp_facts(hidden, heads, tokens, plan=)` (module 03): one layer under TP + SP three ways:
  the course's SPBlock keeping the gathered input, Megatron's re-gather
  (`SPBlock(regather=True)`) and PyTorch's plan (`plan`, a learner's `parallelize_sp`, or
  `torch_plans.parallelize_sp`): the bytes autograd keeps (parameters
  excluded), the collectives of each pass; PyTorch's gradients' placements after backward and
  the all-reduces it makes when they are read; and DTensor's dropout on a CPU mesh: whether the
  ranks' shards got the same mask.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parlab import comm

__all__ = ["tp_facts", "sp_facts"]


def _calls(trace: comm.Trace) -> list[tuple[str, int]]:
    return [(e.kind, e.nbytes) for e in trace.events]


def _placement(t: Any) -> str:
    """'Shard(0)', 'Replicate()', 'Partial(sum)', or 'a plain tensor'."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return "a plain tensor"
    p: Any = t.placements[0]
    if p.is_shard():
        return f"Shard({p.dim})"
    return "Replicate()" if p.is_replicate() else "Partial(sum)" if p.is_partial() else repr(p)


def _local(t: Any) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _attention(mesh: Any, prepared: bool, hidden: int, heads: int) -> dict:
    from torch.distributed.tensor.parallel import parallelize_module

    from parlab.tp.torch_model import make_lm
    from parlab.tp.torch_plans import tp_block_plan

    block = make_lm(8, hidden, heads, 1, seed=0, device=mesh.device_type)[1].blocks[0]
    plan = {k: v for k, v in tp_block_plan().items() if k.startswith("attn.") or prepared
            and k == "attn"}
    attn: Any = parallelize_module(block, mesh, plan).attn
    attn.n_heads //= mesh.size()
    x = torch.randn(2, 5, hidden, device=mesh.device_type, requires_grad=True)
    with comm.trace() as fwd:
        y = attn(x)
    with comm.trace() as bwd:
        y.sum().backward()
    return {"forward": _calls(fwd), "backward": _calls(bwd)}


def tp_facts(vocab: int = 37, hidden: int = 48, heads: int = 12) -> dict:
    """Module 02's facts (module docstring), on this rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    from parlab.launch import device

    dev, t = device(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (t,))
    out: dict[str, Any] = {"attention": {p: _attention(mesh, p, hidden, heads)
                                         for p in (False, True)}}
    torch.manual_seed(0)
    head, emb = nn.Linear(hidden, vocab, bias=False).to(dev), nn.Embedding(vocab, hidden).to(dev)
    x = torch.randn(2, 5, hidden, device=dev)
    target = torch.randint(0, vocab, (2, 5), device=dev)
    whole = F.cross_entropy(head(x).flatten(0, 1), target.flatten()).item()
    parallelize_module(head, mesh, ColwiseParallel(output_layouts=Shard(-1),
                                                   use_local_output=False))
    logits = head(x)
    with comm.trace() as loss_fwd, loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        with comm.trace() as loss_bwd:
            loss.backward()
    out["head"] = {"columns": int(_local(logits).shape[-1]), "loss": _local(loss).item(),
                   "one device": whole, "loss calls": _calls(loss_fwd),
                   "backward calls": _calls(loss_bwd), "placement": _placement(logits)}
    parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
    ids = torch.randint(0, vocab, (2, 5), device=dev)
    emb(ids).sum().backward()
    out["embedding"] = {"weight": (_placement(emb.weight), tuple(_local(emb.weight).shape)),
                        "grad": (_placement(emb.weight.grad),
                                 tuple(_local(emb.weight.grad).shape))}
    out["dtensor attention"] = _dtensor_attention(mesh, hidden, heads)
    return out


def _dtensor_attention(mesh: Any, hidden: int, heads: int) -> str:
    """What running attention on DTensors (use_local_output=False on q, k, v) gives here."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from parlab.tp.torch_model import make_lm

    attn: Any = make_lm(8, hidden, heads, 1, seed=0, device=mesh.device_type)[1].blocks[0].attn
    plan = {n: ColwiseParallel(use_local_output=False) for n in ("q", "k", "v")}
    parallelize_module(attn, mesh, {**plan, "proj": RowwiseParallel(input_layouts=Shard(-1))})
    try:
        attn(torch.randn(2, 5, hidden, device=mesh.device_type))
    except Exception as exc:  # noqa: BLE001 - what PyTorch says is the fact reported
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return "it ran"


def sp_facts(hidden: int = 16, heads: int = 4, tokens: int = 8, *,
             plan: Callable[..., Any] | None = None) -> dict:
    """Module 03's facts (module docstring), on this rank; `plan(block, mesh)` makes PyTorch's
    layer (the course's `torch_plans.parallelize_sp` when None)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from parlab.launch import device
    from parlab.tp.block import DropoutBlock, SPBlock
    from parlab.tp.torch_measure import saved_bytes
    from parlab.tp.torch_model import SplitBlock
    from parlab.tp.torch_plans import parallelize_sp

    dev, rank, t = device(), dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (t,))
    torch.manual_seed(0)
    block = DropoutBlock(hidden, heads, p_drop=0.0).to(dev)
    n = tokens // t
    x = torch.randn(2, tokens, hidden, device=dev)[:, rank * n:(rank + 1) * n].contiguous()
    layers = {"yours (keeps the gathered input)": SPBlock.from_block(block),
              "Megatron's re-gather": SPBlock.from_block(block, regather=True),
              "PyTorch's plan": (plan or parallelize_sp)(SplitBlock.from_block(block), mesh)}
    out: dict[str, Any] = {"layers": {}}
    for name, layer in layers.items():
        def run(a: torch.Tensor, layer: nn.Module = layer) -> torch.Tensor:
            return layer(a) if isinstance(layer, SplitBlock) else layer(a, None)
        with comm.trace() as fwd:
            kept = saved_bytes(run, x.clone().requires_grad_(), exclude=list(layer.parameters()))
        y = run(x.clone().requires_grad_())
        with comm.trace() as bwd:
            y.sum().backward()
        out["layers"][name] = {"kept": kept, "forward": _calls(fwd), "backward": _calls(bwd)}
    theirs = layers["PyTorch's plan"]
    out["grads"] = {name: _placement(p.grad) for name, p in theirs.named_parameters()
                    if name.startswith(("ln1", "attn.proj", "mlp.fc2"))}
    with comm.trace() as read:
        for p in theirs.parameters():
            if isinstance(p.grad, DTensor) and p.grad.placements[0].is_partial():
                p.grad.full_tensor()
    out["read"] = _calls(read)
    torch.manual_seed(0)
    shard = DTensor.from_local(torch.ones(1, n, hidden, device=dev), mesh, [Shard(1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "DTensor random operators may not have complete
        mask = (_local(F.dropout(shard, 0.5, training=True)) != 0).float()  # support on
    masks = [torch.empty_like(mask) for _ in range(t)]  # cpu device mesh")
    dist.all_gather(masks, mask)
    out["dropout"] = {"same mask on every rank": all(torch.equal(m, masks[0]) for m in masks),
                      "kept": float(mask.float().mean())}
    return out
