r"""Asynchronous checkpoints: the training loop waits for a copy of its state, not for the disk.

    saver = AsyncSaver()                                   # every rank (makes a gloo group)
    stall = saver.save(rep, "ckpt/iter_0000004", Position(4, 32))   # returns after the copy
    ...                                                    # train on while it is written
    saver.wait()                                           # on storage: a checkpoint now

    stalls = measure_save_stalls(rep, WORK, tokens)        # in a rank: sync vs async, seconds

A synchronous save (`save_state`, `dcp.save`) returns when every rank's file is written:
the loop, and on a GPU the GPU, idle for the whole write. `torch.distributed.checkpoint.
async_save` splits it in two:

1. staging, in the caller: a copy of the state dict to host memory (`FileSystemWriter` is a
   `BlockingAsyncStager`: `_create_cpu_state_dict` then a copy, so later updates of the
   parameters never reach the snapshot);
2. the rest of the save, in a background thread (`AsyncCheckpointerType.THREAD`; `PROCESS`
   runs it in a separate process), as `_save_state_dict` in torch 2.13's
   `torch/distributed/checkpoint/state_dict_saver.py` does it over `process_group`: DCP's
   planning (each rank's plan gathered to rank 0, the global plan scattered back), every
   rank's file, then the write results gathered to rank 0, which writes `.metadata` from
   them, and the outcome (the metadata, or any rank's failure) broadcast to every rank. It
   returns a `concurrent.futures.Future`.

The loop stalls only for the copy. torchtitan's `checkpoint.async_mode` is this call, over a
gloo group of its own. Megatron-LM's `--async-save` is the same idea with its own writer
(`megatron.core.dist_checkpointing`): it plans in the training loop, writes the files in a
background worker process (`FileSystemWriterAsync`), and finishes each save later in the loop
(`maybe_finalize_async_save`: the write results gathered to rank 0, the metadata written, a
failure flag broadcast, then the tracker file). Two rules come with `dcp.async_save`:

- the background save talks over its own process group: a gloo group made for it, never the
  training's (under NCCL the training's group is CUDA's, and two threads calling
  collectives on one group in an order that differs between ranks pair the wrong calls);
  `async_save` needs a CPU backend in the group it is given;
- one save in flight: the next save waits for the previous Future first (`AsyncSaver.save`
  does), and a snapshot is a checkpoint only once its Future is done (`wait`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.tensor import DTensor

from parlab.compose.checkpoint import save_state, state_dict
from parlab.compose.train import Position, Replica, train_step

__all__ = ["AsyncSaver", "state_bytes", "measure_save_stalls"]


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors of a state dict as this rank holds them (a DTensor's local piece):
    what an async save copies to host memory."""
    total = 0
    for value in state.values():
        local = value.to_local() if isinstance(value, DTensor) else value
        if isinstance(local, torch.Tensor):
            total += local.numel() * local.element_size()
        elif isinstance(value, (bytes, str)):
            total += len(value)
    return total


class AsyncSaver:
    """`save_state`, asynchronously: `save` returns once the state is copied to host memory;
    the write runs in the background over a gloo group of its own (collective to build).
    `kind` is DCP's executor: a thread (the default, what the tests run) or a process."""

    def __init__(self, *, group: dist.ProcessGroup | None = None,
                 kind: AsyncCheckpointerType = AsyncCheckpointerType.THREAD) -> None:
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.kind = kind
        self.pending: Future | None = None
        self.written_at: float | None = None
        """perf_counter() when the last save's write finished (None while it runs)."""

    def save(self, rep: Replica, path: str | Path, position: Position, *,
             keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> float:
        """Start saving this rank's `state_dict` to `path` (collective); the seconds the
        caller was blocked: waiting for the previous save, then the staging copy."""
        start = time.perf_counter()
        self.wait()
        state = state_dict(rep, position)
        writer = dcp.FileSystemWriter(str(path), overwrite=True)
        self.written_at = None
        future = dcp.async_save(keep(state) if keep else state, storage_writer=writer,
                                process_group=self.group, async_checkpointer_type=self.kind)
        assert isinstance(future, Future)  # a blocking stager: no separate staging future
        future.add_done_callback(self._done)
        self.pending = future
        return time.perf_counter() - start

    def _done(self, _: Future) -> None:
        self.written_at = time.perf_counter()

    def wait(self) -> float:
        """Block until the save in flight is on storage (raising what it raised); seconds."""
        start = time.perf_counter()
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()
        return time.perf_counter() - start


def measure_save_stalls(rep: Replica, directory: str | Path, tokens: torch.Tensor, *,
                        repeats: int = 3, steps_between: int = 1,
                        saver: AsyncSaver | None = None) -> dict[str, Any]:
    """In a rank (every rank calls it): `repeats` synchronous and asynchronous saves of `rep`
    to `directory`, each followed by `steps_between` training steps (the async write runs
    under them). Median seconds of each: "sync" (the loop blocked for the whole save),
    "async_stall" (blocked for the copy), "async_write" (from the copy's end to the write's:
    how long the snapshot is not yet a checkpoint), "step" (a training step); "bytes" (what
    this rank copies) and the per-repeat lists under "all"."""
    saver = saver if saver is not None else AsyncSaver()
    directory, step = Path(directory), 0
    out: dict[str, list[float]] = {"sync": [], "async_stall": [], "async_write": [], "step": []}

    def train_on() -> None:
        nonlocal step
        for _ in range(steps_between):
            start = time.perf_counter()
            train_step(rep, step, tokens)
            out["step"].append(time.perf_counter() - start)
            step += 1

    train_on()  # Adam's moments exist: the state is the one a real save writes
    for i in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        save_state(rep, directory / f"sync_{i}", Position(step, step))
        out["sync"].append(time.perf_counter() - start)
        train_on()
        dist.barrier()
        stall = saver.save(rep, directory / f"async_{i}", Position(step, step))
        returned = time.perf_counter()
        out["async_stall"].append(stall)
        train_on()
        saver.wait()
        assert saver.written_at is not None
        out["async_write"].append(saver.written_at - returned)
    staged = state_bytes(state_dict(rep, Position(step, step)))
    return {**{k: sorted(v)[len(v) // 2] for k, v in out.items()}, "bytes": staged, "all": out}
