"""Shared fixtures: the repo root, a check that no rank process outlives a test, and the two
autograde runs several test files read (the course run built in the background from the start
of the session, tests/background.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    if _BACKGROUND:  # the course run's processes belong to no test
        procs -= _BACKGROUND[0].tree()
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
_BACKGROUND: list = []  # the course run's tests/background.Background, once started
# Test files that use about one core or less (a test process and a pair of ranks, sleeps, a
# launcher waiting out a hang; measured with /proc/stat over a whole run): they run first,
# while the course run builds in the background. The others keep both cores busy and run
# after the course run's readers.
ALONGSIDE = frozenset({
    "test_benchmarks", "test_collect", "test_comm", "test_costs", "test_ddp", "test_errors",
    "test_gpu_check", "test_gpu_check_traces", "test_kernel_start", "test_lab", "test_launch",
    "test_leaks", "test_lint", "test_llama", "test_mesh", "test_moe", "test_plan", "test_pp",
    "test_pp_dualpipe", "test_pp_exec", "test_recompute", "test_release", "test_render",
    "test_selfcheck", "test_setup", "test_sp", "test_startup", "test_timeline", "test_tp",
    "test_trace_measure", "test_warm", "test_widget_sync", "test_widgets", "test_widgets_cp",
    "test_widgets_memory", "test_widgets_moe", "test_widgets_plan", "test_widgets_pp",
    "test_widgets_sp", "test_widgets_tp", "test_widgets_whole", "test_workspace"})


def _needs(item: pytest.Item, run: str) -> bool:
    return run in getattr(item, "fixturenames", ())


def _part(item: pytest.Item) -> int:
    """0: alongside the course run; 1: its readers; 2: the rest; 3: the fault run's readers
    (its limits are timing-sensitive: it runs on its own, after the course run)."""
    if _needs(item, "fault_run"):
        return 3
    if _needs(item, "course_run"):
        return 1
    return 0 if item.path.stem in ALONGSIDE else 2


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what does not run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Order the session in `_part`s (the order within each is kept) and start the course run
    in the background (tests/background.py) when a test that runs reads it."""
    items.sort(key=_part)
    if any(_needs(item, "course_run") for item in items) and not config.option.collectonly:
        from background import Background

        _BACKGROUND.append(Background(config._tmp_path_factory.mktemp("course_run")))


def pytest_unconfigure(config: pytest.Config) -> None:
    for background in _BACKGROUND:
        background.stop()


@pytest.fixture(scope="session")
def course_run(tmp_path_factory: pytest.TempPathFactory):
    """Every module (and the smoke fixture) autograded once for alice (full) and bob (blank):
    the background run's result, or built here when it was not started."""
    import time

    from grading_runs import course_run as build

    start = time.perf_counter()
    if _BACKGROUND:
        run = _BACKGROUND[0].result()
        start = _BACKGROUND[0].started
    else:
        run = build(tmp_path_factory.mktemp("course_run"))
    print(f"\ncourse run: {len(run.run.results)} submissions, {run.run.workers} workers, "
          f"{run.run.seconds:.0f} s autograde, {time.perf_counter() - start:.0f} s in all")
    return run


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
def fresh_check_outcomes():
    """Each test starts as a fresh kernel would: no exercise outcomes remembered by the checks
    (parlab.check.exercise), so one test's failures never change another's messages."""
    from parlab.check import reset_outcomes

    reset_outcomes()
    yield
    reset_outcomes()
