"""Shared by every benchmark: interleaved timing, agreement checks, medians, ratios, tables.

The machine is shared and noisy, so contenders are never timed one after the other: they take
turns, A B then B A, repetition after repetition (`interleave`), and a slow spell hits them
alike. Each reports the median of its samples and its ratio to a baseline. `Table.emit(name)`
prints the table and writes the same text to artifacts/bench/<name>.md.

The helpers also run inside ranks started by `parlab.launch.run`; this module is sent to them
by value (cloudpickle), as the benchmark's own functions are, since a rank cannot import it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import torch
from torch import Tensor

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "bench"

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def no_debug_checks() -> None:
    """Ranks started after this run with TORCH_DISTRIBUTED_DEBUG=OFF, as a training job does.

    parlab's launcher defaults to DETAIL, which checks every collective with an extra one
    before it: a cost that would blur the comparison. Call it before the first `run`: the
    ranks inherit the environment of the forkserver, which starts with the first run."""
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "OFF"


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """In a rank of `parlab.launch.run`: no `parlab.comm` listener inside the block.

    The launcher registers one that publishes a status line at the start and end of every
    communication call, so that a hang can say what each rank was doing: tens of
    microseconds a call, which a training job does not pay and which would blur the
    comparison most where a contender makes many calls (a ring's isend/irecv at every step).
    The listeners come back after the block (timeouts still end a hang, unexplained)."""
    from parlab.comm import tracer as comm

    # parlab.comm has no public way to pause its listeners; its list is read at every call
    listeners = list(comm._listeners)
    for listener in listeners:
        comm.remove_listener(listener)
    try:
        yield
    finally:
        for listener in listeners:
            comm.add_listener(listener)


def repeats_option(doc: str, *, default: int, debug_checks: bool = True) -> int:
    """`--repeats N` from the command line (the script's first docstring line is its help).

    With debug_checks=False the ranks run without DETAIL checks (`no_debug_checks`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=default)
    repeats = ap.parse_args().repeats
    if not debug_checks:
        no_debug_checks()
    return repeats


def interleave(contenders: dict[str, Callable[[], object]], repeats: int, *,
               sync: Callable[[], object] = lambda: None, iters: int = 1
               ) -> dict[str, list[float]]:
    """`repeats` samples per contender of the seconds one call takes, taken in turns.

    Each contender runs once untimed first (warm-up). A sample is `iters` calls between two
    `sync()` calls (a barrier when ranks time a collective step together), divided by iters.
    Round i runs the contenders in order, round i + 1 in reverse."""
    for step in contenders.values():
        step()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            sync()
            start = time.perf_counter()
            for _ in range(iters):
                contenders[name]()
            sync()
            samples[name].append((time.perf_counter() - start) / iters)
    return samples


def agree(pairs: list[tuple[Tensor, Tensor]], tolerance: float = 1e-5) -> float:
    """The largest relative difference max|a - b| / max|b| over (a, b) pairs (a gradient's
    scale varies with the model, so an absolute bound would be loose or brittle); raises
    AssertionError above `tolerance`, since the timing must compare equal work."""
    worst = 0.0
    for i, (got, want) in enumerate(pairs):
        if got is None or want is None or got.shape != want.shape:
            raise AssertionError(f"pair {i}: missing tensor or shapes differ")
        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))
    if worst > tolerance:
        raise AssertionError(f"the contenders disagree: relative difference {worst:.1e} > "
                             f"{tolerance:.0e}")
    return worst


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(times) for name, times in samples.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}"


def setting(what: str, repeats: int) -> str:
    """The line above a table: what was measured, how many samples, on what."""
    return (f"{what}; median of {repeats}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}")


@dataclass
class Table:
    """A markdown table under a one-line caption."""

    caption: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [self.caption, "", "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def emit(self, name: str) -> None:
        """Print the table and write it to artifacts/bench/<name>.md."""
        text = self.markdown()
        print(text)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / f"{name}.md").write_text(text)
