"""Limits on a whole process tree: a cgroup per sandbox, for memory and for processes.

A per-process limit (RLIMIT_AS) lets eight ranks take eight times the memory; a cgroup counts
every process of the sandbox together, forks and threads included, and its own counters say
when a limit was hit (the kernel's out-of-memory killer ran, a fork was refused). Both cgroup
layouts are handled: v2 (one tree with `memory.max`, `pids.max`, `*.events`) and v1 (a tree
per controller: `memory.limit_in_bytes`, `memory.oom_control`, `pids.max`, `pids.events`).
Where the cpu controller is there too, each sandbox is one group for the CPU scheduler, with
the default weight: a thousand processes of one submission get the CPU time of one, so a fork
bomb does not slow the submissions graded beside it.

`Cgroups.create(name, memory_bytes=..., processes=...)` makes them (where this process may
write the hierarchy: root, or a delegated subtree), `procs` lists the files a process
writes its pid into to join (parlab.grading.sandbox.jail does, before entering the
sandbox), `hits()` counts what was refused so far, and `remove()` deletes them once their
processes are gone.
`where()` says why there is none, for the grader to print.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_PREFIX = "parlab-"


def _mounts() -> dict[str, Path]:
    """controller ("memory", "pids", or "v2") -> the mount point of its hierarchy."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where, kind, options = Path(parts[1]), parts[2], parts[3].split(",")
        if kind == "cgroup2":
            found.setdefault("v2", where)
        elif kind == "cgroup":
            for controller in ("memory", "pids", "cpu"):
                if controller in options:
                    found.setdefault(controller, where)
    return found


def _v2_ready(root: Path) -> bool:
    try:
        return {"memory", "pids"} <= set((root / "cgroup.subtree_control").read_text().split())
    except OSError:
        return False


def _roots() -> dict[str, Path]:
    """controller -> the folder new cgroups go in (v1 preferred where both are mounted)."""
    mounts = _mounts()
    if "memory" in mounts and "pids" in mounts:
        return {c: mounts[c] for c in ("memory", "pids", "cpu") if c in mounts}
    if "v2" in mounts and _v2_ready(mounts["v2"]):
        return {"v2": mounts["v2"]}
    return {}


def where() -> str | None:
    """None when cgroups can be made here, else why not."""
    roots = _roots()
    if not roots:
        return "no cgroup hierarchy with the memory and pids controllers is mounted"
    for root in roots.values():
        if not os.access(root, os.W_OK):
            return f"{root} is not writable by this user (grade as root, or delegate it)"
    return None


def _number(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed file (`oom_kill 3`), 0 if absent or unreadable."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class Cgroups:
    """The cgroups of one sandbox (see the module doc)."""

    folders: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def create(cls, name: str, *, memory_bytes: int, processes: int) -> Cgroups:
        roots = _roots()
        _sweep(roots)
        made = cls({c: root / f"{_PREFIX}{name}" for c, root in roots.items()})
        for folder in made.folders.values():
            folder.mkdir()
        if "v2" in made.folders:
            v2 = made.folders["v2"]
            (v2 / "memory.max").write_text(str(memory_bytes))
            _write_if_present(v2 / "memory.swap.max", "0")
            (v2 / "pids.max").write_text(str(processes))
        else:
            mem = made.folders["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            _write_if_present(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
            (made.folders["pids"] / "pids.max").write_text(str(processes))
        return made

    @property
    def procs(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def hits(self) -> dict[str, int]:
        """How often each limit was hit so far: {"memory": kills, "processes": refusals}."""
        if "v2" in self.folders:
            v2 = self.folders["v2"]
            return {"memory": _number(v2 / "memory.events", "oom_kill"),
                    "processes": _number(v2 / "pids.events", "max")}
        if not self.folders:
            return {"memory": 0, "processes": 0}
        return {"memory": _number(self.folders["memory"] / "memory.oom_control", "oom_kill"),
                "processes": _number(self.folders["pids"] / "pids.events", "max")}

    def remove(self, wait: float = 5.0) -> None:
        """Delete the cgroups, killing whatever is still in them, once they are empty."""
        deadline = time.monotonic() + wait
        for folder in self.folders.values():
            while folder.exists():
                for pid in _members(folder):
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
                try:
                    folder.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


STALE_S = 3600  # a sandbox lives at most a submission's time limit (900 s by default)


def _sweep(roots: dict[str, Path]) -> None:
    """Remove our cgroups left empty by an earlier run that could not (their last
    processes were still exiting when it gave up waiting): those older than STALE_S."""
    old = time.time() - STALE_S
    for root in roots.values():
        for folder in root.glob(f"{_PREFIX}*"):
            try:
                if folder.stat().st_mtime < old and not _members(folder):
                    folder.rmdir()
            except OSError:
                pass


def _members(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _write_if_present(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass
