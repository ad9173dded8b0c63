r"""Save every N iterations, resume from the last checkpoint: Megatron's --save/--load.

    ckpt = Checkpoints(save="ckpt", interval=4, load="ckpt")
    losses = train(cfg, plan, 12, lr=3e-3, checkpoints=ckpt)   # resumes if ckpt/ has one
    ckpt.resumed                                               # what it resumed from, or None

The directory is laid out as Megatron lays out its own:

    ckpt/latest_checkpointed_iteration.txt   "8": the last checkpoint that is complete
    ckpt/iter_0000004/  ckpt/iter_0000008/   one DCP checkpoint each (`parlab.compose.checkpoint`)
    ckpt/progress.json                       the last iteration finished (rank 0, every step)

A checkpoint is written to `iter_0000008.partial/` and renamed once every rank has written
its part; then the tracker file is replaced. A run killed in the middle of a save resumes
from the checkpoint before, never from half of one. After a failure (torchrun
--max-restarts starts every process again) `resumed.lost` says which iterations were done
after that checkpoint and must be run again: the price of the save interval.

Planted bugs come in through `CheckpointParts` (what to keep of the state before saving;
where the resumed run believes it is), never through flags in this code.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from parlab.compose.checkpoint import Saved, describe_grid, load_state, save_state
from parlab.compose.train import Position, Replica

__all__ = ["TRACKER", "PROGRESS", "iteration_dir", "latest", "CheckpointParts", "Resumed",
           "Checkpoints"]

TRACKER = "latest_checkpointed_iteration.txt"
PROGRESS = "progress.json"


def iteration_dir(directory: str | Path, iteration: int) -> Path:
    return Path(directory) / f"iter_{iteration:07d}"


def latest(directory: str | Path) -> int | None:
    """The iteration of the last complete checkpoint in `directory`, None if there is none."""
    tracker = Path(directory) / TRACKER
    return int(tracker.read_text().strip()) if tracker.exists() else None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def _identity(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class CheckpointParts:
    """The replaceable pieces (tests plant bugs here)."""

    keep: Callable[[dict[str, Any]], dict[str, Any]] = _identity
    """What of the state dict is saved (all of it)."""
    resume_at: Callable[[Position], Position] = _identity
    """Where the resumed run continues (where the checkpoint says)."""


@dataclass(frozen=True)
class Resumed:
    """What a run resumed from."""

    directory: Path
    saved: Saved
    lost: tuple[int, int] | None
    """Iterations first..last (1-based, as the progress bar counts) that had been done after
    this checkpoint before the run stopped, and are done again; None when nothing was lost."""

    @property
    def position(self) -> Position:
        return self.saved.position

    def describe(self) -> list[str]:
        """What the resumed run restored, and the iterations it lost."""
        saved = self.saved
        optimizer = ("restored" if saved.optimizer else
                     "NOT in the checkpoint: Adam starts afresh")
        rng = "restored" if saved.rng else "reseeded (another grid)"
        lines = [f"resumed from {self.directory} (iteration {saved.position.step}, saved on "
                 f"{describe_grid(saved.grid)}; optimizer {optimizer}; random state {rng})"]
        if self.lost is not None:
            a, b = self.lost
            which = f"iteration {a}" if a == b else f"iterations {a}-{b}"
            lines.append(f"lost: {which} ({b - a + 1} in all) had run after that "
                         "checkpoint and run again")
        return lines


@dataclass
class Checkpoints:
    """`train`'s checkpointer: load from `load` once, then save to `save` every `interval`
    iterations and after the last."""

    save: str | Path | None = None
    interval: int | None = None
    load: str | Path | None = None
    step: int | None = None
    """Load this iteration's checkpoint instead of the latest (Megatron's --ckpt-step)."""
    parts: CheckpointParts = CheckpointParts()
    log: Callable[[str], None] | None = None
    """Called on rank 0 with one line per save and per resume."""
    resumed: Resumed | None = field(default=None, init=False)

    def _say(self, line: str) -> None:
        if self.log is not None and dist.get_rank() == 0:
            self.log(line)

    def resume(self, rep: Replica) -> Position:
        if self.load is None:
            return Position()
        iteration = latest(self.load) if self.step is None else self.step
        if iteration is None:
            self._say(f"no checkpoint in {self.load}: starting from iteration 0")
            return Position()
        path = iteration_dir(self.load, iteration)
        if not (path / ".metadata").exists():
            raise FileNotFoundError(f"{path} holds no complete checkpoint (no .metadata); "
                                    f"the iterations saved in {self.load}: "
                                    f"{sorted(d.name for d in Path(self.load).glob('iter_*'))}")
        saved = load_state(rep, path)
        saved = replace(saved, position=self.parts.resume_at(saved.position))
        progress = Path(self.load) / PROGRESS  # how far the run got (none: another dir)
        done = json.loads(progress.read_text())["iteration"] if progress.exists() else 0
        lost = (iteration + 1, done) if done > iteration and self.step is None else None
        self.resumed = Resumed(path, saved, lost)
        for line in self.resumed.describe():
            self._say(line)
        return saved.position

    def after_step(self, rep: Replica, position: Position, *, last: bool) -> None:
        if self.save is None:
            return
        directory = Path(self.save)
        if dist.get_rank() == 0:
            directory.mkdir(parents=True, exist_ok=True)
            _write_atomically(directory / PROGRESS, json.dumps({"iteration": position.step}))
        due = self.interval is not None and position.step % self.interval == 0
        if not (due or last):
            return
        path = iteration_dir(directory, position.step)
        partial = path.with_name(path.name + ".partial")
        save_state(rep, partial, position, keep=self.parts.keep)
        if dist.get_rank() == 0:  # dcp.save returns once every rank's part is written
            if path.exists():  # saved before (a restarted run passing it again)
                shutil.rmtree(path)
            os.replace(partial, path)
            _write_atomically(directory / TRACKER, str(position.step))
        self._say(f"saved iteration {position.step} to {path}")
