"""Recording: every rank under torch.profiler, with the clock mark the merge aligns on, and the
watcher that ends a message's range when it arrives (see parlab.timeline)."""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from parlab import comm

__all__ = ["CLOCK_SYNC", "profiled", "watched"]

CLOCK_SYNC = "parlab clock sync"
_watcher: list[_Watcher] = []  # the one running while profiled() records this process
_stacks = threading.local()


def _comm_ranges(phase: str, event: comm.Event) -> None:
    """A tracer listener: each communication call becomes a profiler range."""
    stack = getattr(_stacks, "open", None)
    if stack is None:
        stack = _stacks.open = []
    if phase == "start":
        shape = "x".join(map(str, event.shape)) or "-"
        rf = record_function(f"comm {event.kind} ({shape}) {event.dtype}".rstrip())
        rf.__enter__()
        stack.append(rf)
    elif stack:
        stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def profiled(path: str | Path, *, cuda: bool = False) -> Iterator[None]:
    """Profile this process into the Chrome trace `path`; comm calls become ranges too.

    Call it inside a rank, after the process group exists: it starts with a barrier and the
    `CLOCK_SYNC` mark the merge aligns on."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    comm.add_listener(_comm_ranges)
    watcher = _Watcher()  # started before the clock mark: starting a thread can take ms
    prof = profile(activities=activities)
    try:
        with _quiet_stderr():  # libkineto announces its start and stop there, every time
            prof.start()
        try:
            if dist.is_initialized():
                dist.barrier()
            with record_function(CLOCK_SYNC):
                pass
            _watcher[:] = [watcher]
            yield
        finally:
            _watcher.clear()
            watcher.stop()
            with _quiet_stderr():
                prof.stop()
        prof.export_chrome_trace(str(path))
    finally:
        watcher.stop()
        comm.remove_listener(_comm_ranges)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the duration (what C++ prints there included)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _Watched:
    """Posted messages, waited for by the watcher thread; `wait()` returns once it has."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles, self.done = list(handles), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for handle in self.handles:
                handle.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting rank
            self.error = exc
        self.done.set()

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()


class _Watcher:
    """One thread that waits for posted messages, in the order they were handed over."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Watched | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="parlab message watcher",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job.run()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.jobs.put(None)
            self.thread.join()


def watched(handles: Sequence[Any]) -> list[Any]:
    """While `profiled` records: one handle for all of `handles` (what isend and irecv
    return), which a thread of its own waits for from now on, so that the trace's message
    ranges end when the messages arrive, not when the rank gets round to waiting. Otherwise:
    `handles`, unchanged."""
    if not _watcher or not handles:
        return list(handles)
    job = _Watched(handles)
    _watcher[0].jobs.put(job)
    return [job]


