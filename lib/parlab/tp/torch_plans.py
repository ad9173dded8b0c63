r"""The course's tensor and sequence parallelism as PyTorch's own API: `parallelize_module` plans.

PyTorch's tensor-parallel API (`torch.distributed.tensor.parallel`) shards a module's
parameters into DTensors (a local piece plus its placement on a `DeviceMesh`: `Shard(d)`,
`Replicate()`, `Partial()`), and converts each module's inputs and outputs with hooks:

- `ColwiseParallel()`: weight `Shard(0)` (rows: output features); takes a `Replicate()` input,
  gives `Shard(-1)` as a plain tensor. The course's `ColumnParallelLinear` (with f).
- `RowwiseParallel()`: weight `Shard(1)` (columns: input features), bias `Replicate()`; takes
  `Shard(-1)`, gives `Replicate()` (an all-reduce). `RowParallelLinear` (with g); with
  `output_layouts=Shard(1)` it reduce-scatters along the sequence instead (SP's g).
- `RowwiseParallel(input_layouts=Replicate())` on an `nn.Embedding`: the table `Shard(0)` (rows
  are words), ids replicated, the looked-up vectors all-reduced: `VocabParallelEmbedding`.
- `SequenceParallel()` on a LayerNorm: its parameters `Replicate()` DTensors, its input and
  output `Shard(1)` (sequence shards): a LayerNorm on this rank's tokens.
- `PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`: the module
  sees its input all-gathered along the sequence (`gather_seq`); its backward reduce-scatters.

`use_local_output=True` (Colwise and Rowwise's default) hands the next module a plain tensor,
this rank's piece; `False` a DTensor. `PrepareModuleInput` hands a DTensor by default, so the
three Linears q, k and v that read it share one DTensor input, and the gradients they send
back meet there before one collective: one all-reduce (TP) or reduce-scatter (SP) per pass,
as f's. Without it each ColwiseParallel wraps the plain input as a DTensor of its own and
each sends back its own (measured in module 02).

The plans here (`tp_block_plan`, `sp_block_plan`, `parallelize_tp`, `parallelize_sp`) are the
course's answers to the exercises of modules 02 and 03, used by the notebooks' figures, the
benchmarks and the tests, and refused while a learner's answer runs. `parallel_loss` is the
cross-entropy under `loss_parallel()`: logits sharded `Shard(-1)` over the vocabulary, three
all-reduces of one number per token (max, sum of exponentials, the target's logit), its
backward inside the context, as PyTorch requires.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["tp_block_plan", "sp_block_plan", "top_plan", "parallelize_tp", "parallelize_sp",
           "parallel_loss"]


def tp_block_plan(*, prepare: bool = True) -> dict[str, Any]:
    """The plan of one SplitBlock under TP: q, k, v and fc1 column-parallel, proj and fc2
    row-parallel, attention's input prepared once (one backward all-reduce, as f's; with
    prepare=False not: three, one per ColwiseParallel, as module 02 measures)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    prepared = {"attn": PrepareModuleInput(input_layouts=Replicate(),
                                           desired_input_layouts=Replicate())}
    return {**(prepared if prepare else {}),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}


def sp_block_plan() -> dict[str, Any]:
    """The plan of one SplitBlock under TP + SP (torchtitan's for a Llama layer): the
    LayerNorms on sequence shards, an all-gather into attention and the MLP, a reduce-scatter
    out of proj and fc2."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def gathered() -> Any:
        return PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())

    return {"ln1": SequenceParallel(), "attn": gathered(),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(), "mlp": gathered(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))}


def top_plan() -> dict[str, Any]:
    """The embedding split over the vocabulary, and the head's logits left sharded over it
    as a DTensor, for `loss_parallel`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"tok": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}


def _local_heads(attn: Any, t: int) -> None:
    if attn.n_heads % t:
        raise ValueError(f"{attn.n_heads} heads do not split over t = {t} ranks: use a number "
                         "of heads that t divides")
    attn.n_heads //= t  # this rank's heads: q holds C/t features


def parallelize_tp(model: nn.Module, mesh: Any, *, prepare: bool = True) -> nn.Module:
    """A SplitLM under TP over the 1-D `mesh`, in place: every block's plan, the embedding
    and the head; each attention told how many heads this rank holds. prepare=False: no
    PrepareModuleInput on the attention (`tp_block_plan`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    for block in model.blocks:  # type: ignore[union-attr]
        parallelize_module(block, mesh, tp_block_plan(prepare=prepare))
        _local_heads(block.attn, mesh.size())
    return parallelize_module(model, mesh, top_plan())


def parallelize_sp(block: nn.Module, mesh: Any) -> nn.Module:
    """A SplitBlock under TP + SP over the 1-D `mesh`, in place: its input and output are this
    rank's (B, T/t, C) tokens, plain tensors."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(block, mesh, sp_block_plan())
    _local_heads(block.attn, mesh.size())
    return block


def parallel_loss(logits: Tensor, target: Tensor, *, backward: bool = True) -> Tensor:
    """The mean cross-entropy of DTensor logits (B, T, V) sharded Shard(-1) against target
    (B, T), under `loss_parallel()`; its backward run inside the context when `backward`.
    Returns the loss, a Replicate DTensor."""
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        if backward:
            loss.backward()
    return loss


def local_float(x: Any) -> float:
    """A loss as a float: a Replicate DTensor's local value, a tensor's, a number's."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        x = x.to_local()
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)
