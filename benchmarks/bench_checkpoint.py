"""How long a save stalls training: a synchronous DCP save against an asynchronous one.

    make bench        or        .venv/bin/python benchmarks/bench_checkpoint.py [--repeats 5]

Module 08's Llama, widened (C = 384, F = 1024: about 40 MB of weights and Adam state per rank
at TP 2), trains on 2 ranks as TP 2 and on 4 as DP 2 × TP 2. In each rank
`parlab.compose.measure_save_stalls` alternates the two contenders, a training step after each
save: `save_state` (dcp.save; the loop waits for the write) and `AsyncSaver.save`
(dcp.async_save over its own gloo group; the loop waits for the copy to host memory, the write
runs under the next step). Medians per rank, the largest rank reported: the stall of each,
their ratio, how long the async write ran behind the training, a training step. First, one
untimed pair saved from the same state: the two checkpoints must hold the same tensors, bit
for bit (tests/test_async_checkpoint.py checks the same on the small model).

On this CPU the "device" memory is host memory and the file lands in the page cache, so the
ratio is far from a GPU cluster's (a PCIe copy against a filesystem write); module 09 says so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from _table import Table, ratio, repeats_option, setting, unwatched
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from parlab.compose import AsyncSaver, Plan, measure_save_stalls, setup, train_step
from parlab.compose.checkpoint import save_state
from parlab.compose.train import Position
from parlab.launch import run
from parlab.model import LlamaConfig, load_corpus

WIDE = LlamaConfig(hidden=384, ffn=1024)
GRIDS = {2: Plan(tp=2, micro_batch_size=4), 4: Plan(dp=2, tp=2, micro_batch_size=2)}


def same_state_both_ways(plan: Plan, directory: Path) -> None:
    rep = setup(WIDE, plan, lr=3e-3)
    train_step(rep, 0, load_corpus()[0])
    save_state(rep, directory / "sync", Position(1, 8))
    saver = AsyncSaver()
    saver.save(rep, directory / "async", Position(1, 8))
    saver.wait()


def whole(path: Path) -> dict[str, torch.Tensor]:
    md = dcp.FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def stalls(plan: Plan, directory: Path, repeats: int) -> dict:
    rep = setup(WIDE, plan, lr=3e-3)
    with unwatched():
        return measure_save_stalls(rep, directory, load_corpus()[0], repeats=repeats)


def main() -> None:
    repeats = repeats_option(__doc__, default=5)
    table = Table(setting("save stall of module 08's Llama at C = 384, F = 1024, a training "
                          "step after each save, largest rank", repeats),
                  ["ranks", "grid", "MB per rank", "sync stall ms", "async stall ms",
                   "sync / async", "async write ms", "step ms"])
    for world, plan in GRIDS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run(same_state_both_ways, world, plan, Path(tmp), timeout=300)
            a, b = whole(Path(tmp) / "sync"), whole(Path(tmp) / "async")
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), \
                "the async checkpoint differs from the sync one"
            ranks = run(stalls, world, plan, Path(tmp), repeats, timeout=600)
        worst = max(ranks, key=lambda r: r["sync"])
        grid = " × ".join(f"{k.upper()} {v}" for k, v in (("dp", plan.dp), ("tp", plan.tp))
                          if v > 1)
        table.add(world, grid, f"{worst['bytes'] / 1e6:.1f}", f"{worst['sync'] * 1e3:.0f}",
                  f"{worst['async_stall'] * 1e3:.0f}", ratio(worst["sync"],
                                                              worst["async_stall"]),
                  f"{worst['async_write'] * 1e3:.0f}", f"{worst['step'] * 1e3:.0f}")
    table.emit("checkpoint")


if __name__ == "__main__":
    main()
