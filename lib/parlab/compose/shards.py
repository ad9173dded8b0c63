r"""Which piece of which single-device tensor each rank holds: the map a checkpoint needs.

    specs = shard_specs(rep)                 # this rank's parameters, in rep.model's order
    specs[0].name, specs[0].shape            # "tok.weight", (V, C): the single device's name
    mesh = rank_mesh(rep.grid, rep.device)   # (ep, tp, dp·cp) ranks of this pipeline stage
    x = as_dtensor(p.detach(), spec, mesh)   # the same storage, described as a DTensor

A parameter of `ParallelLlama` is a piece of one tensor of the single-device `Llama`:

- a pipeline stage holds whole layers: layer i is `blocks.i.*` wherever it runs;
- TP splits wq, wk, wv, gate and up by rows (dim 0), wo and down by columns (dim 1), into t
  equal pieces, and the embedding and the head by the vocabulary (dim 0: rank r holds rows
  [rV'/t, (r+1)V'/t) of the vocabulary padded to V' = t·ceil(V/t), `parlab.tp.vocab`); the
  norms are whole on every TP rank;
- EP splits the experts' (E, F, C) tensors by experts (dim 0) into ep pieces;
- every piece is repeated on the dp × cp ranks (and the embedding on the first and the last
  stage, when the head is tied).

As a DTensor (`torch.distributed.tensor`): the ranks that share this rank's pipeline stage
form a mesh of shape (ep, tp, dp·cp), built from the grid's own groups (no new ones), and a
piece has one placement per mesh dimension, e.g. `[Replicate(), Shard(1), Replicate()]` for
wo. DCP reads the placements to compute each piece's offsets in the whole tensor, which is
what lets a checkpoint saved on one grid load on another. The padded vocabulary depends on t,
so a checkpoint holds the V real rows only: a piece's padding rows (`ShardSpec.rows`) are left
out of its DTensor, whose `Shard(0)` sizes (ceil(V/t) rows, the last ones short) are exactly
the real rows of Megatron's padded pieces; a load on another t fills the real rows in place
and leaves the padding zero.

ZeRO-1 (`chunked=True`): the dp·cp ranks of a DP group hold different slices of Adam's
moments. A checkpoint stores them as FSDP2 stores its shards: each parameter's piece cut
again along dim 0 into dp·cp chunks (`Shard(0)` on the last mesh dimension, `torch.chunk`
sizes, `chunk_rows`); `parlab.compose.zero_layout` moves ZeRO-1's flat slices into that form.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from parlab.compose.grid import Grid
from parlab.compose.stage import ParallelLlama
from parlab.compose.train import Replica
from parlab.model.llama import Llama, LlamaConfig

__all__ = ["ShardSpec", "shard_specs", "rank_mesh", "placements", "as_dtensor", "chunk_rows",
           "global_shapes", "reshard_pieces"]


@dataclass(frozen=True)
class ShardSpec:
    """One local parameter: the single-device tensor it is a piece of, and how it was cut."""

    name: str
    """The single-device `Llama`'s parameter name, e.g. "blocks.2.attn.wo.weight"."""
    param: nn.Parameter
    shape: tuple[int, ...]
    """The whole tensor's shape."""
    tp_dim: int | None = None
    """The dim TP splits (into t equal pieces), None when whole on every TP rank."""
    ep_dim: int | None = None
    """The dim EP splits (an expert tensor's dim 0), None for dense parameters."""
    tied_copy: bool = False
    """The last pipeline stage's copy of a tied embedding: stage 0 holds the same tensor (the
    one piece two pipeline ranks both hold; a global norm counts it once)."""
    rows: int | None = None
    """A vocabulary piece padded past V (`parlab.tp.vocab`): how many of its dim-0 rows are
    real words (the rest are padding, zero); None when every row is real."""


VOCAB_NAMES = ("tok.weight", "head.weight")  # split over the (padded) vocabulary under TP


@functools.lru_cache(maxsize=8)
def global_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The single-device model's parameter shapes, by name."""
    with torch.device("meta"):
        model = Llama(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _named_local(model: ParallelLlama, layers: list[list[int]], grid: Grid,
                 tied: bool) -> list[tuple[str, nn.Parameter, bool]]:
    """(single-device name, parameter, tied copy?) for every parameter of this rank's chunks."""
    p, r = grid.size("pp"), grid.coords["pp"]
    out: list[tuple[str, nn.Parameter, bool]] = []
    for c, stage in enumerate(model.stages):
        if stage.tok is not None:
            out.append(("tok.weight", cast(nn.Parameter, stage.tok.weight), False))
        for k, block in enumerate(stage.blocks):
            i = layers[c * p + r][k]
            out += [(f"blocks.{i}.{n}", q, False) for n, q in block.named_parameters()]
        if stage.norm is not None:
            out.append(("norm.weight", stage.norm.weight, False))
        if stage.head is not None:  # its own matrix, or the tied embedding's copy
            out.append(("tok.weight" if tied else "head.weight", stage.head, tied))
    return out


def _real_rows(name: str, q: nn.Parameter, shape: tuple[int, ...], grid: Grid) -> int | None:
    """The real rows of a vocabulary piece when its padding reaches past V, else None."""
    if name not in VOCAB_NAMES or q.shape[0] == shape[0]:
        return None
    start = grid.coords["tp"] * q.shape[0]  # rows [start, start + V'/t) of the padded table
    real = max(0, min(q.shape[0], shape[0] - start))
    return None if real == q.shape[0] else real


def shard_specs(rep: Replica) -> list[ShardSpec]:
    """This rank's parameters (each once, in `model.unique_parameters()` order) as pieces of
    the single-device tensors."""
    cfg, plan, grid, model = rep.cfg, rep.plan, rep.grid, rep.model
    layers = rep.parts.split_layers(cfg, plan.pp * plan.virtual)
    shapes = global_shapes(cfg)
    experts = {id(q) for q in model.expert_params()}
    by_id: dict[int, ShardSpec] = {}
    for name, q, copy in _named_local(model, layers, grid, cfg.tied):
        if id(q) in by_id:
            continue
        shape = shapes[name]
        cut = [d for d in range(q.dim()) if q.shape[d] != shape[d]]
        if len(cut) > 1:
            raise ValueError(f"{name}: local {tuple(q.shape)} differs from {shape} in more "
                             "than one dim")
        dim = cut[0] if cut else None
        ep_dim = dim if id(q) in experts else None
        tp_dim = None if id(q) in experts else dim
        by_id[id(q)] = ShardSpec(name, q, shape, tp_dim=tp_dim, ep_dim=ep_dim, tied_copy=copy,
                                 rows=_real_rows(name, q, shape, grid))
    return [by_id[id(q)] for q in model.unique_parameters()]


def rank_mesh(grid: Grid, device: torch.device) -> DeviceMesh:
    """The (ep, tp, dp·cp) mesh of the ranks that share this rank's pipeline stage, over the
    grid's existing groups: dim 2 is `grid.expert_dp`, whose order is ZeRO-1's when ep = 1."""
    g = grid.mesh.grid[:, grid.coords["pp"]]  # (dp, ep, cp, tp)
    dp, ep, cp, tp = g.shape
    ranks = g.permute(1, 3, 0, 2).reshape(ep, tp, dp * cp)  # (ep, tp, dp·cp)
    return DeviceMesh.from_group([grid.ep, grid.tp, grid.expert_dp], device.type,
                                 mesh=ranks.contiguous(), mesh_dim_names=("ep", "tp", "dpcp"))


def placements(spec: ShardSpec, *, chunked: bool = False) -> list[Placement]:
    """One placement per mesh dim (ep, tp, dp·cp); `chunked`: ZeRO-1's dim-0 chunks."""
    return [Shard(spec.ep_dim) if spec.ep_dim is not None else Replicate(),
            Shard(spec.tp_dim) if spec.tp_dim is not None else Replicate(),
            Shard(0) if chunked else Replicate()]


def chunk_rows(rows: int, parts: int, index: int) -> tuple[int, int]:
    """Rows [start, stop) of chunk `index` when `rows` are cut into `parts` as DTensor's
    Shard does (`torch.chunk` sizes: ceil(rows/parts) each, the last ones short or empty)."""
    size, start = Shard.local_shard_size_and_offset(rows, parts, index)
    return int(start), int(start) + int(size)


def as_dtensor(local: Tensor, spec: ShardSpec, mesh: DeviceMesh, *,
               chunked: bool = False) -> DTensor:
    """`local` (this rank's piece, or its chunk when `chunked`) as a piece of the whole; a
    padded vocabulary piece without its padding rows (a view: a load fills it in place)."""
    if spec.rows is not None:
        if chunked:
            raise ValueError(f"{spec.name}: a vocabulary padded for TP (V = {spec.shape[0]} not "
                             "divisible by t) cannot be saved with the distributed optimizer's "
                             "chunks: choose t dividing V, or save without ZeRO-1")
        local = local[:spec.rows]  # (real rows, C)
    whole = torch.empty(spec.shape, device="meta")
    return DTensor.from_local(local, mesh, placements(spec, chunked=chunked), run_check=False,
                              shape=whole.shape, stride=whole.stride())


def reshard_pieces(pieces: list[Tensor], dim: int, t_new: int) -> list[Tensor]:
    """t_old equal pieces of one tensor cut along `dim` -> its t_new equal pieces, the way a
    DCP load reads them: new piece r covers [r·n', (r+1)·n') of the whole dim (n' = N/t_new)
    and copies the overlap of every old piece [k·n, (k+1)·n) with it. Nothing is ever
    assembled whole; each new piece owns its memory."""
    n, total = pieces[0].shape[dim], sum(q.shape[dim] for q in pieces)
    if total % t_new:
        raise ValueError(f"{total} along dim {dim} do not split into {t_new} equal pieces")
    m = total // t_new
    out = []
    for r in range(t_new):
        shape = list(pieces[0].shape)
        shape[dim] = m
        new = pieces[0].new_empty(shape)
        lo, hi = r * m, (r + 1) * m
        for k, old in enumerate(pieces):
            a, b = max(lo, k * n), min(hi, (k + 1) * n)  # the overlap, in whole coordinates
            if a < b:
                new.narrow(dim, a - lo, b - a).copy_(old.narrow(dim, a - k * n, b - a))
        out.append(new)
    return out
