r"""torchtitan's `parallelize_llama` on the torchtitan-style Llama: one DeviceMesh, TP + SP
plans per block, FSDP2 over dp (module 08, section 7).

    mesh = world_mesh(plan)                      # ("dp", "pp", "tp"), TP innermost
    part = split_stage(TitanLlama(cfg), mesh["pp"].get_local_rank(), split_layers(cfg, pp))
    parallelize_llama(part, mesh, plan)          # in place: DTensor parameters

After torchtitan/models/llama3/infra/parallelize.py (`apply_tp`, `apply_fsdp`), without its
float8, compile, activation-checkpointing and CP branches:

- the mesh: `init_device_mesh(device, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))`,
  the course's grid `arange(world).view(dp, pp, tp)` (`parlab.mesh`), TP innermost; a slice
  `mesh["tp"]` is this rank's TP group, `mesh["dp"]` its DP group;
- TP + SP on the top level: the embedding `RowwiseParallel(input_layouts=Replicate(),
  output_layouts=Shard(1))` (the table split over the vocabulary, its output reduce-scattered
  onto sequence shards: Megatron's vocabulary-parallel embedding followed by SP's scatter),
  the final norm `SequenceParallel()`, the head `ColwiseParallel(input_layouts=Shard(1),
  output_layouts=Shard(-1), use_local_output=False)`: logits sharded over the vocabulary,
  a DTensor for `loss_parallel` (module 02's vocabulary-parallel loss);
- TP + SP on every block: the two norms `SequenceParallel()` (this rank's T/t tokens, the
  weight a Replicate DTensor whose gradient DTensor sums over TP: SP's all-reduce, done by
  the library), `PrepareModuleInput` all-gathering the sequence into attention and into the
  feed-forward (SP's g-bar), wq, wk, wv, w1, w3 `ColwiseParallel()` (weights Shard(0): rows),
  wo and w2 `RowwiseParallel(output_layouts=Shard(1))` (weights Shard(1): columns; the partial
  sums reduce-scattered back onto sequence shards);
- FSDP2 over `mesh["dp"]`: `fully_shard` on the embedding, on each block, on the norm and the
  head together, then on the root; every parameter then a DTensor on the (dp, tp) mesh,
  `Shard(0)` over dp on top of its TP placement. With a pipeline the units are not resharded
  after forward (torchtitan's default under PP: a stage runs several micro-batches'
  forwards before their backwards, and would gather its weights again for each).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from parlab import launch
from parlab.compose.titan.model import TitanLlama

__all__ = ["MESH_DIMS", "world_mesh", "top_plan", "block_plan", "apply_tp", "apply_fsdp",
           "parallelize_llama"]

MESH_DIMS = ("dp", "pp", "tp")


def world_mesh(plan: Any) -> Any:
    """The run's 3-D DeviceMesh (dp, pp, tp) on this rank's device type (collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(launch.device().type, (plan.dp, plan.pp, plan.tp),
                            mesh_dim_names=MESH_DIMS)


def top_plan(part: TitanLlama, *, loss_parallel: bool = True) -> dict[str, Any]:
    """The styles of the embedding, the final norm and the head, for those this stage holds."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {}
    if part.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                 output_layouts=Shard(1))
    if part.norm is not None:
        plan["norm"] = SequenceParallel()
    if part.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=Shard(1),
                                         output_layouts=Shard(-1) if loss_parallel
                                         else Replicate(), use_local_output=not loss_parallel)
    return plan


def block_plan() -> dict[str, Any]:
    """One block's TP + SP styles (torchtitan's `layer_plan`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def gathered() -> PrepareModuleInput:  # this rank's T/t tokens -> all T (an all-gather)
        return PrepareModuleInput(input_layouts=(Shard(1),),
                                  desired_input_layouts=(Replicate(),))

    return {"attention_norm": SequenceParallel(), "attention": gathered(),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(), "feed_forward": gathered(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}


def apply_tp(part: TitanLlama, tp_mesh: Any, *, loss_parallel: bool = True) -> None:
    """TP + SP over the 1-D `tp_mesh`, in place: the top level, then every block."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(part, tp_mesh, top_plan(part, loss_parallel=loss_parallel))
    for block in part.layers.values():
        parallelize_module(block, tp_mesh, block_plan())


def apply_fsdp(part: TitanLlama, dp_mesh: Any, *, reshard_after_forward: bool) -> None:
    """FSDP2 over `dp_mesh`, in place: the embedding, each block, [norm, head], the root."""
    from torch.distributed.fsdp import fully_shard

    if part.tok_embeddings is not None:
        fully_shard(part.tok_embeddings, mesh=dp_mesh,
                    reshard_after_forward=reshard_after_forward)
    for block in part.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    last: list[nn.Module] = [m for m in (part.norm, part.output) if m is not None]
    if last:
        fully_shard(last, mesh=dp_mesh, reshard_after_forward=False)  # prefetched at once
    fully_shard(part, mesh=dp_mesh)


def parallelize_llama(part: TitanLlama, mesh: Any, plan: Any, *,
                      loss_parallel: bool = True) -> TitanLlama:
    """TP (+SP) over mesh["tp"] when plan.tp > 1, FSDP2 over mesh["dp"] when plan.dp > 1, in
    place; returns `part`. SP is the only TP here (`plan.sequence_parallel` must be True when
    tp > 1: torchtitan's plan shards the sequence between the TP regions)."""
    if plan.tp > 1:
        if not plan.sequence_parallel:
            raise ValueError("torchtitan's TP plan is TP + SP: use Plan(sequence_parallel="
                             "True) with tp > 1")
        apply_tp(part, mesh["tp"], loss_parallel=loss_parallel)
    if plan.dp > 1:
        apply_fsdp(part, mesh["dp"], reshard_after_forward=plan.pp == 1)
    return part
