r"""Distributed checkpoints of a composed run, with torch.distributed.checkpoint (DCP).

    save_state(rep, "ckpt/iter_0000004", Position(4, 32))   # every rank, collective
    saved = load_state(rep, "ckpt/iter_0000004")           # any grid of the same model

What a checkpoint holds (`state_dict`), under the single-device model's names, so that any
grid (or one device) finds each tensor by its name:

- "model.<name>": this rank's piece of parameter <name> as a DTensor (`parlab.compose.shards`:
  TP pieces, pipeline stages' layers, EP experts; repeated pieces are written once, DCP picks
  one rank of the dp × cp ranks that hold the same piece);
- "optim.<name>.exp_avg", "optim.<name>.exp_avg_sq": Adam's two moments, the same pieces;
  under ZeRO-1 each DP rank writes its own 1/d of them, as dim-0 chunks (`zero_layout`),
  and a plain-Adam run loads them whole, or a ZeRO-1 run of another d its own chunks;
- "train.meta": iteration, consumed samples (the data position), Adam's step count, the grid
  and the model's shape (JSON);
- "rng.rank<r>": rank r's torch (and CUDA) and Python random states.

Each rank writes its pieces to its own file (`__<rank>_0.distcp`); rank 0 writes `.metadata`,
the table of every piece's offsets and sizes in its whole tensor and the file that holds it.
Loading on another grid asks for the new grid's pieces; DCP reads the overlapping parts of the
saved ones and copies them into place: the resharding.

The random states are per rank. They are restored when the grid is the one they were saved
on; on another grid rank r's stream has no counterpart (a dropout mask is drawn per rank), so
each rank is seeded from (model seed, iteration, rank) instead, as Megatron needs
--no-load-rng when the parallel sizes change. This model draws no random numbers in
training (no dropout), so its losses do not depend on it.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor

from parlab.compose.shards import ShardSpec, as_dtensor, chunk_rows, rank_mesh, shard_specs
from parlab.compose.train import Position, Replica
from parlab.compose.zero_layout import from_chunks, to_chunks
from parlab.dp.zero1 import ZeRO1

__all__ = ["Saved", "grid_of", "state_dict", "save_state", "load_state", "saved_meta",
           "describe_grid"]

MOMENTS = ("exp_avg", "exp_avg_sq")
GRID_FIELDS = ("dp", "pp", "tp", "cp", "ep", "virtual", "sequence_parallel",
               "distributed_optimizer")


@dataclass(frozen=True)
class Saved:
    """What `load_state` restored."""

    position: Position
    grid: dict[str, Any]
    """The grid it was saved on (`grid_of`)."""
    optimizer: bool
    """False: the checkpoint held no optimizer state (Adam started afresh)."""
    rng: bool
    """True: each rank's random state was restored (same grid); False: re-seeded."""


def grid_of(rep: Replica) -> dict[str, Any]:
    """The grid's sizes and options (and the world size), as saved in train.meta."""
    return {**{f: getattr(rep.plan, f) for f in GRID_FIELDS}, "world": dist.get_world_size()}


def describe_grid(grid: dict[str, Any]) -> str:
    """'DP 2 × PP 2 × TP 2 with SP, ZeRO-1' (the sizes above 1)."""
    axes = " × ".join(f"{a.upper()} {grid[a] * (grid['ep'] if a == 'dp' else 1)}"
                      for a in ("dp", "pp", "tp", "cp", "ep") if grid[a] > 1)
    extras = [x for x, on in (("SP", grid["sequence_parallel"]),
                              ("ZeRO-1", grid["distributed_optimizer"])) if on]
    return (axes or "one rank") + (" with " + ", ".join(extras) if extras else "")


def _zero(rep: Replica) -> ZeRO1 | None:
    return rep.optimizer if isinstance(rep.optimizer, ZeRO1) else None


def _rows_of(local: Tensor, zero: ZeRO1) -> Tensor:
    """This DP rank's dim-0 chunk of a local piece."""
    a, b = chunk_rows(local.shape[0] if local.dim() else 1, zero.d, zero.rank)
    return local[a:b]


def _moments(rep: Replica, specs: list[ShardSpec]) -> dict[str, list[Tensor]] | None:
    """Each parameter's two moments: whole local pieces (Adam) or chunks (ZeRO-1); None
    before the first step."""
    zero = _zero(rep)
    if zero is not None:
        state = zero.inner.state.get(zero.master)
        if not state:
            return None
        return {m: to_chunks(zero, state[m]) for m in MOMENTS}
    assert isinstance(rep.optimizer, torch.optim.Optimizer)
    states = [rep.optimizer.state.get(s.param) for s in specs]
    if not all(states):
        return None
    return {m: [st[m] for st in states if st] for m in MOMENTS}


def _optimizer_step(rep: Replica) -> int:
    zero = _zero(rep)
    if zero is not None:
        state = zero.inner.state.get(zero.master, {})
    else:
        assert isinstance(rep.optimizer, torch.optim.Optimizer)
        state = rep.optimizer.state.get(rep.model.unique_parameters()[0], {})
    return int(state["step"]) if "step" in state else 0


def _rng_bytes() -> bytes:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return pickle.dumps((torch.get_rng_state(), random.getstate(), cuda))


def _set_rng(blob: bytes) -> None:
    cpu, python, cuda = pickle.loads(blob)  # noqa: S301 - our own checkpoint
    torch.set_rng_state(cpu)
    random.setstate(python)
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def state_dict(rep: Replica, position: Position) -> dict[str, Any]:
    """Everything this rank saves: its pieces of the model and of Adam, the position, its RNG."""
    specs, mesh, zero = shard_specs(rep), rank_mesh(rep.grid, rep.device), _zero(rep)
    out: dict[str, Any] = {}
    for spec in specs:
        local = spec.param.detach()
        piece = local if zero is None else _rows_of(local, zero)
        out[f"model.{spec.name}"] = as_dtensor(piece, spec, mesh, chunked=zero is not None)
    moments = _moments(rep, specs)
    for m, pieces in (moments or {}).items():
        for spec, piece in zip(specs, pieces, strict=True):
            out[f"optim.{spec.name}.{m}"] = as_dtensor(piece, spec, mesh,
                                                       chunked=zero is not None)
    meta = {"iteration": position.step, "consumed_samples": position.consumed_samples,
            "optimizer_step": _optimizer_step(rep), "grid": grid_of(rep),
            "config": asdict(rep.cfg)}
    out["train.meta"] = json.dumps(meta)
    out[f"rng.rank{dist.get_rank()}"] = _rng_bytes()
    return out


def save_state(rep: Replica, path: str | Path, position: Position, *,
               keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    """Write this rank's `state_dict` to the DCP checkpoint at `path` (collective; `keep`
    filters the dict first: how the tests plant a checkpoint that forgets something)."""
    state = state_dict(rep, position)
    writer = dcp.FileSystemWriter(str(path), overwrite=True)  # a restarted run saves again
    dcp.save(keep(state) if keep else state, storage_writer=writer)


def saved_meta(path: str | Path) -> tuple[dict[str, Any], set[str]]:
    """(train.meta, every key) of the checkpoint at `path` (collective: all ranks load)."""
    keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    box: dict[str, Any] = {"train.meta": ""}
    dcp.load(box, checkpoint_id=str(path))
    return json.loads(box["train.meta"]), keys


def _check_config(rep: Replica, meta: dict[str, Any]) -> None:
    mine = asdict(rep.cfg)
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["config"].items()}
    wrong = [f"{k}={saved.get(k)} (this run: {v})" for k, v in mine.items() if saved.get(k) != v]
    if wrong:
        raise ValueError("the checkpoint holds another model: " + ", ".join(wrong) +
                         "; resume with the model arguments it was saved with")


def _targets(rep: Replica, specs: list[ShardSpec], optimizer: bool) -> tuple[
        dict[str, Any], dict[str, list[Tensor]]]:
    """What to load into: the parameters themselves (DCP loads in place), and new buffers
    for the moments (this grid's pieces, or its ZeRO-1 chunks)."""
    mesh, zero = rank_mesh(rep.grid, rep.device), _zero(rep)
    out: dict[str, Any] = {}
    buffers: dict[str, list[Tensor]] = {m: [] for m in MOMENTS} if optimizer else {}
    for spec in specs:
        out[f"model.{spec.name}"] = as_dtensor(spec.param.detach(), spec, mesh)
        for m in buffers:
            local = spec.param.detach()
            buf = torch.zeros_like(local if zero is None else _rows_of(local, zero))
            buffers[m].append(buf)
            out[f"optim.{spec.name}.{m}"] = as_dtensor(buf, spec, mesh, chunked=zero is not None)
    return out, buffers


def _install_optimizer(rep: Replica, specs: list[ShardSpec], buffers: dict[str, list[Tensor]],
                       step: int) -> None:
    """Put the loaded moments where this run's optimizer keeps them."""
    zero = _zero(rep)
    count = torch.tensor(float(step))  # AdamW's own step counter (a float32 scalar)
    if zero is None:
        assert isinstance(rep.optimizer, torch.optim.Optimizer)
        for i, spec in enumerate(specs):
            rep.optimizer.state[spec.param] = {"step": count.clone(),
                                               **{m: buffers[m][i] for m in buffers}}
        return
    with torch.no_grad():  # the master slice: the loaded weights, flattened and cut
        whole = zero._flat([p.detach() for p in zero.params])
        lo = zero.rank * zero.shard
        zero.master.copy_(whole[lo:lo + zero.shard])
    zero.inner.state[zero.master] = {"step": count.clone(),
                                     **{m: from_chunks(zero, buffers[m]) for m in buffers}}


def load_state(rep: Replica, path: str | Path) -> Saved:
    """Load the checkpoint at `path` into this rank's model and optimizer, for this grid
    (collective). Without optimizer state in it, Adam starts afresh (a model-only checkpoint)."""
    meta, keys = saved_meta(path)
    _check_config(rep, meta)
    specs = shard_specs(rep)
    optimizer = any(k.startswith("optim.") for k in keys)
    state, buffers = _targets(rep, specs, optimizer)
    same = meta["grid"] == grid_of(rep)
    rng_key = f"rng.rank{dist.get_rank()}"
    if same and rng_key in keys:
        state[rng_key] = b""
    dcp.load(state, checkpoint_id=str(path))
    if optimizer:
        _install_optimizer(rep, specs, buffers, meta["optimizer_step"])
    if rng_key in state:
        _set_rng(state[rng_key])
    else:
        seed = rep.cfg.seed * 1_000_003 + meta["iteration"] * 1_000 + dist.get_rank()
        torch.manual_seed(seed)
        random.seed(seed)
    position = Position(meta["iteration"], meta["consumed_samples"])
    return Saved(position, meta["grid"], optimizer, rng_key in state)
