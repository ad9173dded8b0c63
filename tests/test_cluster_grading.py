"""`make autograde ENGINE=slurm` on the test cluster (tests/cluster.py): a small class of the
faultlab module, honest and blank notebooks beside fault and attack corpus entries, graded as
a Slurm job array and merged by its dependent job, scores as the class's expected ones
(grading_runs.expected_class, from the corpus entries, which the local run of test_class.py
is held to) and, cell by cell, as a local run of the same class; one task cancelled mid-way
is named with its students and nothing of it is left running; a run killed outright is ended
by the next, which grades just the cancelled task's students.
`make test-cluster` (PARLAB_TEST_CLUSTER=1), as root; about 2 minutes."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time

import pytest
from grading_runs import (
    BLANK,
    FAULT_ARGS,
    FAULT_MODULE,
    FAULTS_DIR,
    FULL,
    NO_SANDBOX,
    _submit,
    attacking,
    blank_as_graded,
    broken,
    expected_class,
    full_answers,
    load_attacks,
    load_faults,
)

from parlab.grading import GradeRun, autograde_parallel, generate_release
from parlab.grading.engines.record import class_results
from parlab.grading.engines.results import RUN_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_CLUSTER") != "1",
                       reason="the Slurm cluster's tests run with `make test-cluster`"),
]

FAULTS = ("infinite_loop", "rank_raises")  # the loop waits out a 15 s cell limit: time to kill
ATTACKS = ("write_gradebook",)
SLOW = "fault-infinite-loop"


def _class(root) -> list[str]:
    """faultlab released into `root` and handed in by alice (full), bob (blank) and one
    student per chosen corpus entry; the students."""
    shutil.copytree(FAULTS_DIR / FAULT_MODULE, root / "solutions" / FAULT_MODULE)
    generate_release(FAULT_MODULE, root=root)
    full = full_answers(root, FAULT_MODULE)
    blank = blank_as_graded(root, FAULT_MODULE)
    _submit(root, FULL, FAULT_MODULE, full)
    _submit(root, BLANK, FAULT_MODULE, blank)
    for fault in (f for f in load_faults() if f.name in FAULTS):
        _submit(root, fault.student, FAULT_MODULE, broken(fault, full))
    for attack in (a for a in load_attacks() if a.name in ATTACKS):
        _submit(root, attack.student, FAULT_MODULE, attacking(attack, blank))
    return sorted(p.name for p in (root / "submitted").iterdir())


def _autograde(cluster, root, sbatch_args: str = "") -> subprocess.Popen[str]:
    """What `make autograde ENGINE=slurm TASKS=3 WORKERS=2` runs, on `root`; 1.5 GB a task
    (the nodes have 4 GB; the sandbox's own limit stays FAULT_ARGS' 3 GiB)."""
    return subprocess.Popen(
        [sys.executable, "-m", "parlab.grading", "--root", str(root), "autograde",
         "--engine", "slurm", "--tasks", "3", "--workers", "2",
         f"--sbatch-args=--mem=1500M {sbatch_args}",
         *(["--unsafe"] if NO_SANDBOX else []), "--", *FAULT_ARGS],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _task_of(root, student: str, other_than: int = 0) -> tuple[int, int, str]:
    """(array job, task index, run token) of the share grading `student` in a run whose
    array is not `other_than`, once that task has started."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for run in (root / "autograded" / ".parlab" / "slurm").glob("*"):
            jobs = (run / "jobs").read_text().split() if (run / "jobs").exists() else []
            for share in run.glob("worker*"):
                if (share.is_dir() and (share / "submitted" / student).exists() and jobs
                        and int(jobs[0]) != other_than):
                    index = int(share.name.removeprefix("worker"))
                    if (run / f"worker{index}.started").exists():
                        return int(jobs[0]), index, run.name
        time.sleep(0.5)
    raise TimeoutError(f"no task grading {student} started in 90 s")


def _processes_of(token: str) -> list[str]:
    """Live processes whose PARLAB_GRADE_RUN is the run's token or one of its tasks'."""
    needle = f"{RUN_ENV}={token}".encode()
    found = []
    for proc in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{proc}/environ", "rb") as f:
                if any(v.startswith(needle) for v in f.read().split(b"\0")):
                    found.append(proc)
        except OSError:
            pass
    return found


def _scores(root) -> dict[str, tuple[float | None, dict]]:
    return {r.student: (r.score, {g: c[0] for g, c in r.cells.items()})
            for r in class_results(root)}


def test_a_class_graded_as_a_slurm_array_scores_as_locally_and_a_killed_task_is_regraded(
        slurm_cluster, tmp_path):
    start = time.monotonic()
    root = slurm_cluster.tmp / f"course-{secrets.token_hex(3)}"
    students = _class(root)
    expect = {s: raw for s, (raw, _, _) in expected_class().items() if s in students}
    assert len(expect) == len(students) == 5, students

    # 0. Nodes that cannot make the sandbox (no bubblewrap in the jobs' environment only):
    # every task fails, saying why, and nothing is graded
    refused = 0  # that run's array
    if not NO_SANDBOX:
        nowhere = _autograde(slurm_cluster, root, "--export=ALL,PARLAB_BWRAP=/nonexistent")
        out0, _ = nowhere.communicate(timeout=120)
        assert nowhere.returncode == 1, out0
        assert len(re.findall(r"^\[parlab\] slurm task \d+_\d FAILED: failed \(no sandbox can be "
                              r"made on node[12]: bubblewrap", out0, re.MULTILINE)) == 3, out0
        assert all(r.score is None for r in GradeRun.load(root).results), out0
        refused = int(re.search(r"as Slurm job (\d+)", out0).group(1))

    # 1. The array, one task cancelled while it grades (the infinite loop's 15 s cell)
    first = _autograde(slurm_cluster, root)
    array, task, _ = _task_of(root, SLOW, other_than=refused)
    time.sleep(3)
    slurm_cluster.run("scancel", f"{array}_{task}")
    out, _ = first.communicate(timeout=240)
    run = GradeRun.load(root)
    killed = {r.student for r in run.results if r.score is None}
    assert SLOW in killed and len(killed) < len(students), out
    named = re.search(rf"slurm task {array}_{task} CANCELLED.*not graded: (.*); the next", out)
    assert named and {s.split("/")[0] for s in named.group(1).split(", ")} == killed, out
    assert all("slurm task" in r.status for r in run.results if r.student in killed), out
    assert re.search(r"job \d+: \d+ pending, [1-9]\d* running, \d+ done", out), out
    assert _processes_of(run.token) == [], "a process of the run outlived it"
    assert not list(slurm_cluster.tmp.glob("parlab-grade-*")), "a task's scratch is left"

    # 2. A run killed outright while it grades (no chance to cancel its jobs)
    orphaned = _autograde(slurm_cluster, root)
    orphan, _, orphan_token = _task_of(root, SLOW, other_than=array)
    orphaned.kill()
    orphaned.wait()

    # 3. The next run ends what that one left, and grades just the cancelled task's students
    third = _autograde(slurm_cluster, root)
    out3, _ = third.communicate(timeout=240)
    assert third.returncode == 0, out3
    assert slurm_cluster.job(orphan)["JobState"] == "CANCELLED", out3
    assert _processes_of(orphan_token) == [], "a process of the killed run outlived it"
    assert {r.student for r in GradeRun.load(root).results} == killed, out3
    slurm_scores = _scores(root)
    assert {s: score for s, (score, _) in slurm_scores.items()} == expect, out + out3
    # the earlier runs' folders are removed (the last one's stays until the next run), and
    # the last one's merge job merged both of its tasks' submissions itself
    runs = list((root / "autograded" / ".parlab" / "slurm").iterdir())
    assert len(runs) == 1, runs
    assert f"merged {len(killed)} submissions" in (runs[0] / "merge.out").read_text(), out3
    slurm_seconds = time.monotonic() - start

    # 3. The same class graded on this machine: the same score in every cell
    local = tmp_path / "local"
    assert _class(local) == students
    autograde_parallel(local, FAULT_MODULE, workers=2, unsafe=NO_SANDBOX, nbgrader_args=FAULT_ARGS)
    assert _scores(local) == slurm_scores
    print(f"slurm runs {slurm_seconds:.0f} s, whole test {time.monotonic() - start:.0f} s")
