"""Run a function on several ranks, from a notebook cell, a test or a script.

    from parlab.launch import run

    def hello():
        x = torch.ones(2) * dist.get_rank()
        dist.all_reduce(x)
        return x

    run(hello, world_size=4)       # [tensor([6., 6.]), ... one per rank, in rank order]

Every rank calls `fn(*args, **kwargs)` inside an initialised default process group. `fn`
may be defined in a notebook cell: it travels by value (cloudpickle). Ranks are forked from
a forkserver that has torch imported already, so a warm call costs a fraction of a second.
The backend is NCCL with one GPU per rank when there are enough GPUs (the device map
"cpu:gloo,cuda:nccl"), gloo on CPU otherwise: `parlab.launch.devices`. What a rank returns
comes back with its tensors on the CPU.

Failures never hang and never leave a process behind:
- a rank that raises -> `RankError` naming the rank, with its traceback;
- ranks that call different collectives, or pass different shapes to one ->
  `CollectiveMismatch` (torch's DETAIL debug mode checks every collective);
- a rank that dies (os._exit, killed for memory) -> `RankError` with its exit code;
- a hang (a rank skipped a collective, an endless loop) -> `CollectiveTimeout` after
  `timeout` seconds, or sooner when it is certain, saying what each rank was doing;
- KeyboardInterrupt (what nbgrader sends on a cell timeout) -> every rank is killed;
- a Jupyter kernel that ran ranks ends its forkserver when it is shut down, and exits at
  once, leaving nothing in /tmp (parlab.launch.shutdown);
- with PARLAB_NCCL_RULES=1, a call NCCL would refuse or deadlock on -> `NcclRuleBroken`
  (parlab.launch.nccl_rules), although gloo ran it.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import spawn
from multiprocessing.connection import wait
from typing import Any, TypeVar

import cloudpickle

from parlab import timeline
from parlab.launch import devices, nccl_rules, shutdown
from parlab.launch import rank as _rank
from parlab.launch.devices import pick_backend
from parlab.launch.diagnose import Watch
from parlab.launch.errors import NcclRuleBroken, Origins, RankError, code_origins, relocate
from parlab.launch.scratch import scratch_dir
from parlab.launch.waiting import WaitingLine

__all__ = ["run", "pick_backend"]

# What the forkserver imports once, so that no rank pays for it again: torch and the launcher's
# rank side, and symbolic_shapes, which the first backward imports.
_PRELOAD = ["torch", "torch.distributed", "cloudpickle", "parlab.launch.rank",
            "torch.fx.experimental.symbolic_shapes"]
# ... and, when the caller has imported the package on the left itself (modules 07 to 09, the
# tests), what its ranks import: torch._dynamo (the first optimizer imports it, 0.5 s a rank)
# and parlab.compose (0.4 s a rank). An 8-rank run of module 08 on 2 cores would otherwise
# spend its first 4 s importing; a module that needs neither (a class of module 02) does not
# pay the forkserver's 0.9 s for them.
_PRELOAD_IF_IMPORTED = {"parlab.capstone": ["torch._dynamo"],
                        "parlab.compose": ["torch._dynamo", "parlab.compose"]}
_START_LOCK = threading.Lock()
T = TypeVar("T")
ERROR_GRACE_S = 0.5  # after a first error, wait this long for the other ranks' reports


def forkserver_preload() -> list[str]:
    """What this process's forkserver imports when it starts (the comments above)."""
    extra = [m for used, more in _PRELOAD_IF_IMPORTED.items() if used in sys.modules
             for m in more]
    return list(dict.fromkeys(_PRELOAD + extra))


NO_FORKSERVER = ("parlab.launch starts ranks from multiprocessing's forkserver, which Linux and "
                 "macOS have and native Windows does not: on Windows, run the course in WSL 2 "
                 "(README.md, \"Platforms\")")


def _context() -> Any:
    if "forkserver" not in mp.get_all_start_methods():
        raise RuntimeError(NO_FORKSERVER)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(forkserver_preload())
    return ctx


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Start ranks without re-running the caller's script: `fn` travels by value, so the
    child needs nothing from __main__, and a script without an `if __name__ == "__main__"`
    guard would otherwise start itself again in every rank."""
    original = spawn.get_preparation_data

    def preparation_data(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _START_LOCK:
        spawn.get_preparation_data = preparation_data
        try:
            yield
        finally:
            spawn.get_preparation_data = original


def _check_args(fn: Any, world_size: Any, timeout: Any) -> None:
    if not callable(fn):
        raise TypeError(f"run() needs a function to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _serialise(fn: Any, args: tuple, kwargs: dict) -> bytes:
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise TypeError(f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments to the "
                        f"ranks: {exc}. Pass tensors, numbers and functions, not open files, "
                        "locks or process groups.") from exc


def run(fn: Callable[..., T], world_size: int = 2, *args: Any, backend: str | None = None,
        timeout: float = 60.0, trace: str | os.PathLike | None = None,
        **kwargs: Any) -> list[T]:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return the results in rank order.

    `trace="run.json"` profiles every rank (parlab.timeline) and writes one merged Chrome
    trace there, one process row per rank, when the run succeeds."""
    _check_args(fn, world_size, timeout)
    # gloo asked for stays gloo on a GPU box: NCCL's rules do not apply to it
    rules = nccl_rules.enabled() and devices.asked_backend(backend) != "gloo"
    backend, gpus = devices.placement(world_size, backend)
    payload = _serialise(fn, args, kwargs)
    ctx = _context()
    shutdown.stop_helpers_at_kernel_shutdown()  # a kernel's shutdown ends the forkserver too
    # removed below; swept by a later run if this process is killed before it can
    workdir = str(scratch_dir("run", at_exit=False))
    procs: list[Any] = []
    lifelines: list[Any] = []
    try:
        receivers, statuses = [], []
        for rank in range(world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            life_r, life_w = ctx.Pipe(duplex=False)
            status = ctx.RawArray(ctypes.c_char, _rank.STATUS_BYTES)
            p = ctx.Process(target=_rank.main, name=f"parlab-rank-{rank}", daemon=True, args=(
                rank, world_size, backend, os.path.join(workdir, "store"), timeout + 5.0,
                payload, send_end, life_r, status, None if trace is None else workdir,
                gpus[rank] if gpus else None, rules))
            with _without_main():
                p.start()
            send_end.close()
            life_r.close()
            procs.append(p)
            lifelines.append(life_w)
            receivers.append(recv_end)
            statuses.append(status)
        origins = code_origins(fn, args, kwargs)
        results, calls = _collect(procs, receivers, Watch(statuses, timeout), origins)
        if all(c is not None for c in calls):  # PARLAB_NCCL_RULES=1 (nccl_rules)
            try:
                nccl_rules.check_pairs(calls)
            except NcclRuleBroken as exc:
                raise NcclRuleBroken(relocate(str(exc), origins)) from None
        if trace is not None:
            timeline.merge([os.path.join(workdir, f"rank{r}.json") for r in range(world_size)],
                           trace)
        return results
    finally:
        _shutdown(procs, lifelines)
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(procs: list, receivers: list, watch: Watch, origins: Origins) -> tuple[list, list]:
    """Every rank's result and its logged calls (None unless PARLAB_NCCL_RULES=1), in rank
    order; raise the first real failure."""
    results: dict[int, Any] = {}
    calls: dict[int, Any] = {}
    errors: list[tuple] = []
    first_error_at: float | None = None
    pending = list(receivers)
    line = WaitingLine(watch.timeout)  # in a notebook, after a few seconds: what it waits for
    try:
        while len(results) < len(procs):
            now = time.monotonic()
            if first_error_at is not None and (now - first_error_at > ERROR_GRACE_S
                                               or not pending):
                raise RankError.from_reports(errors, watch.describe(results), origins)
            watch.check(results, errors)  # raises CollectiveTimeout on a sure or timed-out hang
            line.show(len(procs) - len(results), len(procs), lambda: watch.brief(results))
            first_error_at = _receive(procs, receivers, pending, results, calls, errors,
                                      first_error_at)
    finally:
        line.close()
    return [results[r] for r in range(len(procs))], [calls[r] for r in range(len(procs))]


def _receive(procs: list, receivers: list, pending: list, results: dict, calls: dict,
             errors: list, first_error_at: float | None) -> float | None:
    """Take what the ranks have sent within 50 ms; when the first error arrived."""
    ready = wait(pending + [p.sentinel for p in procs], timeout=0.05)
    for rank, conn in enumerate(receivers):
        if conn not in pending or (conn not in ready and procs[rank].exitcode is None):
            continue
        pending.remove(conn)
        try:
            msg = pickle.loads(conn.recv_bytes())
        except EOFError:  # died without a word
            procs[rank].join(1.0)
            msg = ("error",) + _death(rank, procs[rank].exitcode)
        if msg[0] == "ok":
            results[rank], calls[rank] = msg[2], msg[3]
        else:
            errors.append(msg[1:])
            first_error_at = first_error_at or time.monotonic()
    return first_error_at


def _death(rank: int, code: int | None) -> tuple:
    why = f"exit code {code}"
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = f"signal {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    text = (f"rank {rank} died ({why}) without returning or raising: os._exit, a crash, or "
            "the operating system killing it")
    return (rank, "RankDied", text, text, time.time())


def _shutdown(procs: list, lifelines: list) -> None:
    """Every rank ends here: closing the lifeline ends a healthy rank, SIGKILL the rest."""
    for w in lifelines:
        w.close()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive() or p.exitcode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            p.join(5.0)
