"""Shared fixtures: the repo root, a check that no rank process outlives a test, and torchrun
with a temporary folder of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# first, so that this session's forkserver preloads what module 08's ranks import
# (parlab.launch.runner, _PRELOAD_IF_IMPORTED)
import parlab.compose  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

# Every run the tests start is held to NCCL's rules on gloo (parlab.launch.nccl_rules), the
# course run's kernels and ranks included (the sandbox passes the variable on): what passes
# here would neither fail nor deadlock on a GPU box. A test of something gloo allows and NCCL
# does not is marked `gloo_only`.
os.environ.setdefault("PARLAB_NCCL_RULES", "1")


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # zombies are already dead
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def rank_processes() -> set[int]:
    """Processes started for ranks: descendants of this test process, except the forkserver
    (which multiprocessing keeps alive on purpose and which is not a rank)."""
    procs = descendants(os.getpid())
    from multiprocessing import forkserver

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return {p for p in procs if p != server and not _is_helper(p)}


def _is_helper(pid: int) -> bool:
    """multiprocessing's resource tracker also lives on by design."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # already gone


@pytest.fixture
def no_orphans():
    """Fail the test if a process it started is still alive after it (a kernel that an earlier
    test is still shutting down is not this test's; a dying rank gets 3 s to be reaped)."""
    before = rank_processes()
    yield
    deadline = time.monotonic() + 3.0
    while (left := rank_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"rank processes outlived run(): {sorted(left)}"


# --- autograde runs shared by several test files (tests/grading_runs.py) ---------------------
@pytest.fixture(scope="session")
def course_run(tmp_path_factory: pytest.TempPathFactory):
    """Every module (and the smoke fixture) autograded once for alice (full) and bob (blank)."""
    import time

    from grading_runs import course_run as build

    start = time.perf_counter()
    run = build(tmp_path_factory.mktemp("course_run"))
    print(f"\ncourse run: {len(run.run.results)} submissions, {run.run.workers} workers, "
          f"{run.run.seconds:.0f} s autograde, {time.perf_counter() - start:.0f} s in all")
    return run


@dataclass(frozen=True)
class Torchrun:
    """torchrun as a test starts it: `cmd` (the venv's torchrun) with `env` (os.environ and
    TMPDIR set to `tmp`, a folder of this test's own). torchrun keeps every run's logs in a
    temporary folder (/tmp/torchelastic_*) it never removes: 19 of them after a day's runs of
    the suite; in `tmp` they go with it."""

    tmp: Path

    @property
    def cmd(self) -> list[str]:
        return [str(Path(sys.executable).parent / "torchrun")]

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self.tmp), **extra}


@contextlib.contextmanager
def torchrun_tmp() -> Iterator[Torchrun]:
    """A Torchrun whose temporary folder is removed when the block ends."""
    tmp = Path(tempfile.mkdtemp(prefix="parlab-torchrun-"))
    try:
        yield Torchrun(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def torchrun() -> Iterator[Torchrun]:
    """Every test that starts torchrun takes it from here (tests/test_train_script.py checks)."""
    with torchrun_tmp() as t:
        yield t


@pytest.fixture(scope="session")
def fault_run(tmp_path_factory: pytest.TempPathFactory):
    """The fault corpus (autograder/faults/) autograded in one parallel run."""
    import time

    from grading_runs import fault_run as build

    start = time.perf_counter()
    run = build(tmp_path_factory.mktemp("fault_run"), tmp_path_factory.mktemp("inbox"))
    print(f"\nfault run: {len(run.run.results)} submissions, {run.run.workers} workers, "
          f"{run.run.seconds:.0f} s autograde, {time.perf_counter() - start:.0f} s in all")
    return run


@pytest.fixture(autouse=True)
def _gloo_only(request, monkeypatch):
    """A test marked `gloo_only` runs without NCCL's rules."""
    if request.node.get_closest_marker("gloo_only"):
        monkeypatch.delenv("PARLAB_NCCL_RULES", raising=False)


@pytest.fixture(autouse=True)
def fresh_check_outcomes():
    """Each test starts as a fresh kernel would: no exercise outcomes remembered by the checks
    (parlab.check.exercise), so one test's failures never change another's messages."""
    from parlab.check import reset_outcomes

    reset_outcomes()
    yield
    reset_outcomes()


@pytest.fixture(autouse=True)
def close_figures():
    """Figures a test drew are closed after it (pyplot keeps every figure open until then:
    the widget tests alone would hold dozens), without importing pyplot where none was."""
    yield
    if (plt := sys.modules.get("matplotlib.pyplot")) is not None:
        plt.close("all")


# --- a real Slurm for `make test-cluster` (tests/cluster.py) ----------------------------------
@pytest.fixture(scope="session")
def slurm_cluster():
    """One test cluster (two nodes on this host) shared by every cluster test of the session;
    they skip, saying why, where none can start (not root, Slurm or munge not installed)."""
    import cluster

    why = cluster.missing()
    if why:
        pytest.skip(f"no Slurm test cluster: {why}")
    with cluster.running_cluster() as running:
        yield running
