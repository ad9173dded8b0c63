r"""Module 09's checkpoint format for the torch-API Llama: one format for both builds.

    save_titan(rep, "ckpt/iter_0000002", Position(2, 16))   # every rank, collective
    position = load_titan(rep2, "ckpt/iter_0000002")         # any grid; or the course's
    saved = parlab.compose.load_state(composed_rep, "ckpt/iter_0000002")   # composed model

PyTorch's own way to checkpoint a model that FSDP2 and TP have turned into DTensors is
`torch.distributed.checkpoint.state_dict`: `get_model_state_dict(model)` gives every
parameter by its name as the DTensor this rank holds (its FSDP and TP shard, no gather),
`get_optimizer_state_dict(model, optimizer)` Adam's moments the same way, and
`set_model_state_dict` / `set_optimizer_state_dict` put them back. DCP (`dcp.save`,
`dcp.load`) writes each rank's pieces and, on load, reads whichever saved pieces overlap the
pieces this grid asks for: the resharding of module 09.

What differs from the course's composed model (`parlab.compose.checkpoint`) is only the
names. Renamed on the way out and back (`names.single_name`), the torch-API model writes
what the composed one writes: "model.<name>" and "optim.<name>.exp_avg" / ".exp_avg_sq"
under the single-device model's names, and "train.meta" with the iteration, the data
position, Adam's step count, the grid and the model's shape. Either build then loads the
other's checkpoint, on any grid.

The tied head. Its copy `output.weight` is saved under "tok.weight", like the composed
model's last-stage copy (DCP keeps one of equal pieces). Without a pipeline one rank holds
both the embedding and the copy, and a DCP request may name a key once: the copy is loaded
in a second request. No random state is saved: this model draws none in training.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from parlab.compose.checkpoint import GRID_FIELDS, saved_meta
from parlab.compose.titan.names import single_name
from parlab.compose.titan.train import TitanReplica
from parlab.compose.train import Position

__all__ = ["titan_state", "save_titan", "load_titan"]

MOMENTS = ("exp_avg", "exp_avg_sq")


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _torch_state(rep: TitanReplica) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, flattened optimizer) state dicts of PyTorch's API, torchtitan's names."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return (get_model_state_dict(rep.part),
            get_optimizer_state_dict(rep.part, rep.optimizer, options=_options()))


def _renamed(rep: TitanReplica, model: dict[str, Any], optim: dict[str, Any]
             ) -> list[tuple[str, dict[str, Any], str]]:
    """(the course's key, which dict, its key there) for every tensor of this rank."""
    tied = rep.cfg.tied
    out = []
    for fqn in model:
        name = single_name(fqn, tied=tied)
        out.append((f"model.{name}", model, fqn))
        out += [(f"optim.{name}.{m}", optim, f"state.{fqn}.{m}") for m in MOMENTS]
    return out


def _grid(rep: TitanReplica) -> dict[str, Any]:
    return {**{f: getattr(rep.plan, f) for f in GRID_FIELDS}, "world": dist.get_world_size()}


def _adam_step(optim: dict[str, Any]) -> int:
    steps = [float(v) for k, v in optim.items() if k.startswith("state.") and k.endswith(".step")]
    return int(steps[0]) if steps else 0


def titan_state(rep: TitanReplica, position: Position) -> dict[str, Any]:
    """What this rank saves, in the composed model's format (a tied copy named once)."""
    model, optim = _torch_state(rep)
    out: dict[str, Any] = {}
    for key, where, inner in _renamed(rep, model, optim):
        out.setdefault(key, where[inner])  # the tied copy: the embedding's equal piece
    meta = {"iteration": position.step, "consumed_samples": position.consumed_samples,
            "optimizer_step": _adam_step(optim), "grid": _grid(rep),
            "config": asdict(rep.cfg)}
    out["train.meta"] = json.dumps(meta)
    return out


def save_titan(rep: TitanReplica, path: str | Path, position: Position) -> None:
    """Write this rank's `titan_state` to the DCP checkpoint at `path` (collective)."""
    dcp.save(titan_state(rep, position),
             storage_writer=dcp.FileSystemWriter(str(path), overwrite=True))


def load_titan(rep: TitanReplica, path: str | Path) -> Position:
    """Load the checkpoint at `path` (written by either build, on any grid) into this rank's
    model and optimizer (collective); the position to continue from."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    meta, keys = saved_meta(path)
    mine = asdict(rep.cfg)
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["config"].items()}
    wrong = [f"{k}={saved.get(k)} (this run: {v})" for k, v in mine.items() if saved.get(k) != v]
    if wrong:
        raise ValueError("the checkpoint holds another model: " + ", ".join(wrong))
    model, optim = _torch_state(rep)
    with_optimizer = any(k.startswith("optim.") for k in keys)
    requests: list[dict[str, Any]] = [{}, {}]  # a key at most once per request
    for key, where, inner in _renamed(rep, model, optim):
        if key.startswith("optim.") and not with_optimizer:
            continue
        requests[0 if key not in requests[0] else 1][key] = where[inner]
    for request in requests:
        if request:
            dcp.load(request, checkpoint_id=str(path))  # in place, into this grid's pieces
    set_model_state_dict(rep.part, model)
    if with_optimizer:
        for k in [k for k in optim if k.startswith("state.") and k.endswith(".step")]:
            optim[k] = torch.tensor(float(meta["optimizer_step"]))
        set_optimizer_state_dict(rep.part, rep.optimizer, optim, options=_options())
    return Position(meta["iteration"], meta["consumed_samples"])
