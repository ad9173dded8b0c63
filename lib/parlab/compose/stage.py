r"""Pipeline stages of the Llama: which layers each stage runs, and this rank's chunks of them.

    layers = split_layers(cfg, pp * v)          # [[0, 1], [2, 3]]: module 04's balancing
    model = ParallelLlama(llama, grid, layers, sequence_parallel=True)
    logits = model.chunks[c](x, pos)            # chunk c of this rank is stage c·pp + r

The p·v stages take consecutive layers. How many each: `parlab.pp.balance_stages` on the
forward FLOPs per token of every layer (`layer_costs`: the projections, the $T^2$ attention
scores, the SwiGLU or the routed experts), with the LM head's $2CV$ added to the last layer:
stage 0 also embeds (a table lookup, no FLOPs), the last stage also runs the head. Equal
layers and a light head give Megatron's equal split.

Placement is module 04's looped one (`parlab.pp.stage_of`): rank r's chunk c is stage
c·p + r, so with v = 2 chunks rank 0 runs stages 0 and p.

Stage 0 embeds the token ids. Under TP the vocabulary is split (Megatron-LM's
`VocabParallelEmbedding`, `parlab.tp.vocab`): TP rank r holds rows $[rV'/t, (r+1)V'/t)$ of the
table padded to $V' = t\lceil V/t \rceil$ rows, looks up the ids it holds and all-reduces the
parts. With SP it keeps its own rows of the result (`scatter_to_sequence_parallel_region`,
Megatron's choice: the gradient is all-gathered, so each TP rank's rows of the table get
their whole gradient). The last stage applies the final RMSNorm on its tokens, all-gathers
them (`gather_from_sequence_parallel_region`) and applies its rows of the head, a
column-parallel linear: logits (b, n, V'/t), the columns of this rank's words, never
gathered; the loss is `parlab.tp.vocab_parallel_cross_entropy` (`run_schedule`). Each rank's
logits then give only a part of the gradient of the gathered tokens: the gather's backward
reduce-scatters (without SP, f before the head all-reduces it, as Megatron's
ColumnParallelLinear does).

Tied head across the pipeline: the last stage holds a copy of the embedding; after backward
the first and last pipeline rank add their two gradients (`grid.embedding`, as Megatron's
embedding group), so both copies take the same step. When one rank holds both stages the
head uses the embedding's own Parameter.
"""

from __future__ import annotations

import copy
from typing import cast

import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.compose.experts import ExpertParallelMoE
from parlab.compose.grid import Grid, Positions
from parlab.compose.layer import ParallelBlock
from parlab.model.llama import Llama, LlamaBlock, LlamaConfig
from parlab.pp.schedules import stage_of
from parlab.pp.simulator import balance_stages
from parlab.tp.mappings import (
    copy_to_tp_region,
    gather_from_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    tp_rank_and_size,
)
from parlab.tp.vocab import VocabParallelEmbedding, padded_vocab_size, vocab_range

__all__ = ["layer_costs", "split_layers", "Stage", "ParallelLlama"]


def layer_costs(cfg: LlamaConfig) -> list[float]:
    """Forward FLOPs per token of each layer; the last one also carries the head's 2CV."""
    c, d, t = cfg.hidden, cfg.hidden // cfg.heads, cfg.seq
    attention = 2 * c * (cfg.heads + 2 * cfg.kv_heads) * d + 2 * cfg.heads * d * c
    attention += 4 * t * cfg.heads * d  # scores and their weighted sum over T keys
    dense = 6 * c * cfg.ffn  # gate, up, down
    moe = 2 * c * cfg.experts + cfg.top_k * dense  # router, then k experts
    costs = [float(attention + (moe if i in cfg.moe_layers else dense))
             for i in range(cfg.layers)]
    costs[-1] += 2 * c * cfg.vocab
    return costs


def split_layers(cfg: LlamaConfig, n_stages: int) -> list[list[int]]:
    """Consecutive layer indices of each stage, balanced by `layer_costs`."""
    counts = balance_stages(layer_costs(cfg), n_stages)
    starts = [sum(counts[:s]) for s in range(n_stages)]
    return [list(range(a, a + n)) for a, n in zip(starts, counts, strict=True)]


def _vocab_rows(weight: Tensor, *, group: dist.ProcessGroup | None = None) -> Tensor:
    """This TP rank's rows of a (V, C) table or head, padded as Megatron-LM pads the
    vocabulary: (V'/t, C), a copy, the rows past V zero."""
    rank, t = tp_rank_and_size(group)
    start, end = vocab_range(padded_vocab_size(weight.shape[0], t), rank, t)
    out = weight.new_zeros(end - start, *weight.shape[1:])  # (V'/t, C)
    real = max(0, min(end, weight.shape[0]) - start)
    out[:real] = weight[start:start + real]
    return out


def _embedding(model: Llama, grid: Grid) -> nn.Module:
    """Stage 0's table: the single device's, or this TP rank's rows of it."""
    if grid.size("tp") == 1:
        return copy.deepcopy(model.tok)
    w = model.tok.weight.detach()
    tok = VocabParallelEmbedding(w.shape[0], w.shape[1], group=grid.tp, device="meta")
    tok.weight = nn.Parameter(_vocab_rows(w, group=grid.tp))  # (V'/t, C); meta: no RNG drawn
    return tok


class Stage(nn.Module):
    """One stage: [embedding] -> its ParallelBlocks -> [final norm, head]."""

    def __init__(self, model: Llama, layers: list[int], grid: Grid, *, first: bool,
                 last: bool, sequence_parallel: bool, embedding: nn.Module | None) -> None:
        super().__init__()
        self.grid, self.sequence_parallel = grid, sequence_parallel
        self.first, self.last = first, last
        self.tok = _embedding(model, grid) if first else None
        blocks = [model.blocks[i] for i in layers]
        assert all(isinstance(b, LlamaBlock) for b in blocks)
        self.blocks = nn.ModuleList(ParallelBlock(b, grid, sequence_parallel=sequence_parallel)
                                    for b in blocks if isinstance(b, LlamaBlock))
        self.norm = copy.deepcopy(model.norm) if last else None
        self.head: nn.Parameter | None = None  # its own matrix, or the tied copy
        self.tied_to: nn.Module | None = None  # the embedding it shares a rank with
        # (registered as a submodule on purpose: its weight is then also this chunk's
        # parameter, so a W step computes the head's share of its gradient)
        if last and model.head is not None:
            self.head = nn.Parameter(_vocab_rows(model.head.weight.detach(), group=grid.tp))
        elif last and (self.tok is not None or embedding is not None):
            self.tied_to = self.tok or embedding
        elif last:
            self.head = nn.Parameter(_vocab_rows(model.tok.weight.detach(), group=grid.tp))

    def head_weight(self) -> Tensor:
        """(V'/t, C): this TP rank's rows of the head's matrix, of its tied copy, or this
        rank's embedding itself."""
        if self.tied_to is not None:
            return cast(Tensor, self.tied_to.weight)
        assert self.head is not None
        return self.head

    def forward(self, x: Tensor, pos: Positions) -> Tensor:
        tp = self.grid.tp
        if self.tok is not None:  # x: (b, n) token ids
            x = self.tok(x)  # (b, n, C)
            if self.sequence_parallel:
                x = scatter_to_sequence_parallel_region(x, group=tp)  # (b, n/t, C)
        for block in self.blocks:
            x = block(x, pos)  # (b, n/t, C) with SP, else (b, n, C)
        if self.norm is None:
            return x
        x = self.norm(x)
        if self.sequence_parallel:  # backward: reduce-scatter (each rank's logits give a part)
            x = gather_from_sequence_parallel_region(x, group=tp)  # (b, n, C)
        else:  # f: backward all-reduce
            x = copy_to_tp_region(x, group=tp)
        return F.linear(x, self.head_weight())  # (b, n, V'/t): this rank's words


class ParallelLlama(nn.Module):
    """This rank's chunks: chunk c is stage c·pp + r of the split `layers` (one list a stage)."""

    def __init__(self, model: Llama, grid: Grid, layers: list[list[int]], *,
                 sequence_parallel: bool) -> None:
        super().__init__()
        p, r = grid.size("pp"), grid.coords["pp"]
        if len(layers) % p:
            raise ValueError(f"{len(layers)} stages do not fill pp={p} ranks evenly")
        self.grid, self.n_stages, self.tied = grid, len(layers), model.head is None
        self.vocab = model.cfg.vocab  # V: the logits' columns past it are padding
        chunks: list[Stage] = []
        for c in range(len(layers) // p):
            s = stage_of(r, c, p)
            chunks.append(Stage(model, layers[s], grid, first=s == 0, last=s == len(layers) - 1,
                                sequence_parallel=sequence_parallel,
                                embedding=chunks[0].tok if chunks else None))
        self.chunks = nn.ModuleList(chunks)
        self.stages = chunks  # the same modules, typed: chunk c is stages[c]

    def unique_parameters(self) -> list[nn.Parameter]:
        """Every parameter once (a tied head on the embedding's rank is the same Parameter)."""
        seen: dict[int, nn.Parameter] = {}
        for p in self.parameters():
            seen.setdefault(id(p), p)
        return list(seen.values())

    def sequence_parallel_params(self) -> list[nn.Parameter]:
        """Gradients that are partial sums over TP: RMSNorms (and MoE layers) under SP."""
        out = [p for c in self.stages for b in c.blocks if isinstance(b, ParallelBlock)
               for p in b.sequence_parallel_params()]
        if any(c.sequence_parallel for c in self.stages):
            out += [c.norm.weight for c in self.stages if c.norm is not None]
        return out

    def expert_params(self) -> list[nn.Parameter]:
        """The parameters only this ep rank holds: its experts."""
        return [p for m in self.modules() if isinstance(m, ExpertParallelMoE)
                for p in m.expert_params()]

    def dense_params(self) -> list[nn.Parameter]:
        """Everything else: averaged over the dp × ep × cp ranks."""
        experts = {id(p) for p in self.expert_params()}
        return [p for p in self.unique_parameters() if id(p) not in experts]

    def embedding_copies(self) -> list[nn.Parameter]:
        """This rank's copy of a tied embedding when another pipeline rank holds the other
        (stage 0's table, or the last stage's head); empty otherwise."""
        if not self.tied or self.grid.size("pp") == 1:
            return []
        return ([cast(nn.Parameter, c.tok.weight) for c in self.stages if c.tok is not None]
                + [c.head for c in self.stages if c.last and c.head is not None])
