"""Peak memory, measured the same way in every benchmark: the peak resident set size (RSS).

Linux keeps each process's RSS high-water mark (VmHWM in /proc/self/status); writing 5 to
/proc/self/clear_refs resets it to the current RSS. Two uses:

- `peak_above(fn)`, for the compute benchmarks (cp, tp, pp), in each rank: fn runs once to warm
  up, then again between a reset and a read; it returns VmHWM minus the RSS just before that
  call (the median of three such calls): the most memory the call held at once beyond what
  was already resident (model weights built before it are in the baseline, tensors it
  allocates and frees are not). Freed blocks of 16 KiB or more go back to the operating
  system at once (glibc's mmap threshold, set by `exact_frees`), and before each measured call
  the pages of the heap's free chunks are released (`release_free`), so that memory an
  earlier call or an import freed but kept cannot hide this call's. That setting slows
  allocation, so the benchmarks measure memory in ranks of their own, started after the
  timed ones.
- `peak_rss()`, for the benchmarks whose cost is a whole process (launch, autograde): this
  process's high-water mark since it started, baseline 0; `children_peak_rss(fn)` the largest
  one among the processes fn starts and waits for (their RSS counts pages shared with a parent
  in full).

Sizes are bytes; `mib` formats them. The module is sent to ranks by value, as `_table` is.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import resource
import statistics
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MMAP_THRESHOLD = 16 * 1024  # bytes: blocks at least this large are unmapped when freed
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _status(field: str) -> int:
    """A size field of /proc/self/status (kB there), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} (measuring memory needs Linux)")


def _glibc() -> Any:
    """glibc, or None where there is none (then its allocator settings do not apply)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def exact_frees() -> None:
    """Make freed blocks of MMAP_THRESHOLD bytes or more leave the RSS at once (glibc)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)


def release_free() -> None:
    """Return the pages of every free chunk in the heap to the operating system (glibc's
    malloc_trim). A rank forked from the launcher's forkserver starts with a heap full of
    chunks that its imports freed; a call that reuses them would show no growth in RSS."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def peak_rss() -> int:
    """This process's RSS high-water mark (since it started, or since the last reset)."""
    return _status("VmHWM")


def peak_above(fn: Callable[[], object], *, repeats: int = 3) -> int:
    """Bytes: peak RSS during one call of fn above the RSS just before it (module docstring),
    the median of `repeats` calls after one warm-up call. It sets `exact_frees` for the rest
    of the process: measure in ranks of their own, not before timing in the same ones."""
    exact_frees()
    fn()
    peaks = []
    for _ in range(repeats):
        release_free()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status("VmRSS")
        fn()
        peaks.append(max(0, peak_rss() - base))
    return int(statistics.median(peaks))


def _in_child(fn: Callable[[], Any], conn: Any) -> None:
    result = fn()
    conn.send((result, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))


def children_peak_rss(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn's result, bytes): fn runs in a forked process; the bytes are the largest peak RSS
    among the processes it started and waited for (and theirs, recursively). A child's peak
    starts at the RSS of the process that forked it (Linux counts the pages a child was forked
    with in its ru_maxrss): call it from a small process, as bench_autograde does."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_in_child, args=(fn, child))
    proc.start()
    child.close()
    try:
        result, peak = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the measured call died (exit code {proc.exitcode})") from None
    proc.join()
    return result, peak


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"
