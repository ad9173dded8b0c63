"""Scratch folders that do not outlive the process that made them.

    from parlab.launch.scratch import scratch_dir
    TRACES = scratch_dir("traces")   # /tmp/parlab-scratch-<uid>/<pid>-traces-<random>

A notebook's traces and checkpoints, a run's rendezvous files: each goes into its own folder
under one per-user root (mode 0700). The folder is removed when its process exits normally
(a kernel shut down or restarted, a script's end); a process killed outright (SIGKILL, a
power cut) cannot clean up, so every new scratch_dir() first removes the folders of processes
that no longer run. The root itself goes when the last process that used it exits and leaves
it empty. Nothing of the course is left in /tmp after a day of work.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["scratch_dir", "scratch_root"]


def scratch_root() -> Path:
    """The user's root of scratch folders (created 0700; refused if someone else owns it)."""
    root = Path(tempfile.gettempdir()) / f"parlab-scratch-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.stat().st_uid != os.getuid() or root.is_symlink():
        raise PermissionError(f"{root} belongs to another user: remove it, or set TMPDIR to a "
                              "folder of your own")
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process with that number
        return True
    return True


def _sweep(root: Path) -> None:
    """Remove the folders of processes that no longer run."""
    for folder in root.iterdir():
        pid = folder.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _remove_root_if_empty() -> None:
    """At exit, after this process's folders: the root, unless another process's are in it."""
    with contextlib.suppress(OSError):
        os.rmdir(Path(tempfile.gettempdir()) / f"parlab-scratch-{os.getuid()}")


_ROOT_REMOVAL: list[bool] = []  # registered once per process, before any folder's removal


def scratch_dir(name: str, *, at_exit: bool = True) -> Path:
    """A new empty folder for this process's `name` (traces, checkpoints, ...), removed when
    the process exits; `at_exit=False` for a caller that removes it itself (the launcher's
    run folders: one per run, in a kernel that may make thousands)."""
    if not _ROOT_REMOVAL:
        atexit.register(_remove_root_if_empty)  # atexit runs last-in first: after the folders
        _ROOT_REMOVAL.append(True)
    for attempt in range(3):
        root = scratch_root()
        try:
            _sweep(root)
            path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{name}-", dir=root))
            break
        except FileNotFoundError:  # another process removed the empty root just now
            if attempt == 2:
                raise
    if at_exit:
        atexit.register(shutil.rmtree, path, True)
    return path
