"""Shared fixtures: the repo root, and a check that no rank process outlives a test."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
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
_RUNS = ("course_run", "fault_run")
_wanted: set[str] = set()  # which of the two shared runs the selected tests use
_started: dict[str, concurrent.futures.Future] = {}


def pytest_collection_modifyitems(config, items) -> None:
    _wanted.update(name for item in items for name in getattr(item, "fixturenames", ())
                   if name in _RUNS)


def _build(name: str, tmp_path_factory: pytest.TempPathFactory):
    import time

    import grading_runs

    start = time.perf_counter()
    if name == "course_run":
        run = grading_runs.course_run(tmp_path_factory.mktemp("course_run"))
    else:
        run = grading_runs.fault_run(tmp_path_factory.mktemp("fault_run"),
                                     tmp_path_factory.mktemp("inbox"))
    print(f"\n{name.replace('_', ' ')}: {len(run.run.results)} submissions, {run.run.workers} "
          f"workers, {run.run.seconds:.0f} s autograde, {time.perf_counter() - start:.0f} s in all")
    return run


def _shared_run(name: str, tmp_path_factory: pytest.TempPathFactory):
    """The run `name`; the first of the two that a session needs starts both, side by side:
    the fault run mostly waits (timeouts, killed kernels) while the course run computes."""
    if not _started:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(_RUNS))
        for other in sorted(_wanted | {name}):
            _started[other] = pool.submit(_build, other, tmp_path_factory)
        pool.shutdown(wait=False)
    if name not in _started:
        _started[name] = concurrent.futures.ThreadPoolExecutor(1).submit(
            _build, name, tmp_path_factory)
    # both done before any test goes on: no test sees the other run's processes (no_orphans)
    concurrent.futures.wait(list(_started.values()))
    return _started[name].result()


@pytest.fixture(scope="session")
def course_run(tmp_path_factory: pytest.TempPathFactory):
    """Every module (and the smoke fixture) autograded once for alice (full) and bob (blank)."""
    return _shared_run("course_run", tmp_path_factory)


@pytest.fixture(scope="session")
def fault_run(tmp_path_factory: pytest.TempPathFactory):
    """The fault corpus (autograder/faults/) autograded in one parallel run."""
    return _shared_run("fault_run", tmp_path_factory)


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
