"""Asynchronous saves (parlab.compose.async_checkpoint) write what a synchronous save writes.

On 2 ranks (TP 2): after 2 steps the same state is saved by `save_state` (dcp.save) and by
`AsyncSaver` (dcp.async_save over its own gloo group), and a third step changes every
parameter while the async write may still run. The async checkpoint is the sync one to the
bit, read back on the same grid (`load_state` brings back the parameters as they were at the
save) and on another one: each checkpoint loaded whole in this process, one tensor per name,
by DCP without a process group. The stall measurement returns its numbers and the bytes this
rank staged; which stall is smaller is a benchmark's ratio (benchmarks/bench_checkpoint.py),
never asserted on wall time here.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from parlab.compose import Plan, setup, shard_specs, train_step
from parlab.compose.async_checkpoint import AsyncSaver, measure_save_stalls, state_bytes
from parlab.compose.checkpoint import load_state, save_state, state_dict
from parlab.compose.train import Position
from parlab.launch import run
from parlab.model import LlamaConfig, load_corpus

CFG, LR, PLAN = LlamaConfig(), 3e-3, Plan(tp=2, micro_batch_size=4)

pytestmark = [pytest.mark.usefixtures("no_orphans"),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def save_both_ways(directory) -> dict:
    rep = setup(CFG, PLAN, lr=LR)
    tokens, _ = load_corpus()
    for step in range(2):
        train_step(rep, step, tokens)
    specs = shard_specs(rep)
    at_save = {s.name: s.param.detach().clone() for s in specs}
    position = Position(2, 16)
    save_state(rep, directory / "sync", position)
    saver = AsyncSaver()
    stall = saver.save(rep, directory / "async", position)
    train_step(rep, 2, tokens)  # every parameter changes while the write may be running
    moved = all(not torch.equal(at_save[s.name], s.param) for s in specs)
    saver.wait()
    saved = load_state(rep, directory / "async")
    back = [s.name for s in specs if not torch.equal(at_save[s.name], s.param.detach())]
    return {"stall": stall, "moved": moved, "not_back": back, "step": saved.position.step,
            "written": saver.written_at is not None}


def whole(path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint, whole, loaded in this process (no process group)."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def test_an_async_save_is_the_sync_save_to_the_bit(tmp_path):
    ranks = run(save_both_ways, 2, tmp_path, timeout=60)
    for r in ranks:
        assert r["moved"], "the step after the save changed nothing: the test proves nothing"
        assert not r["not_back"], f"not the parameters of the save: {r['not_back']}"
        assert r["step"] == 2 and r["written"] and r["stall"] > 0
    sync, asynchronous = whole(tmp_path / "sync"), whole(tmp_path / "async")
    assert sync.keys() == asynchronous.keys()
    assert any(k.startswith("optim.") for k in sync), "no optimizer state saved"
    for key, tensor in sync.items():
        assert torch.equal(tensor, asynchronous[key]), key
    md = dcp.FileSystemReader(str(tmp_path / "async")).read_metadata()
    assert {"train.meta", "rng.rank0", "rng.rank1"} <= set(md.state_dict_metadata)


def stalls(directory) -> dict:
    rep = setup(CFG, PLAN, lr=LR)
    tokens, _ = load_corpus()
    out = measure_save_stalls(rep, directory, tokens, repeats=2)
    out["expected_bytes"] = state_bytes(state_dict(rep, Position(0, 0)))
    return out


def test_the_stall_measurement_reports_each_mode(tmp_path):
    for r in run(stalls, 2, tmp_path, timeout=60):
        for key in ("sync", "async_stall", "async_write", "step"):
            assert r[key] > 0 and r[key] in r["all"][key], key
        assert len(r["all"]["sync"]) == 2 and len(r["all"]["step"]) == 5
        assert r["bytes"] == r["expected_bytes"] > 0
    assert {p.name for p in tmp_path.iterdir()} == {"sync_0", "sync_1", "async_0", "async_1"}
    assert all((tmp_path / f"async_{i}" / ".metadata").exists() for i in (0, 1))
