"""The grader's sandbox (parlab.grading.sandbox), seen from inside a kernel, warm and cold.

One notebook, run by ResilientExecute with the sandbox on, looks around and reports what it
sees as JSON: its user, its environment, its processes, the files around it, the grader's
TCP port, and a 2-rank gloo check. The test compares that with what the grader put outside:
a canary in the notebook's real folder's parent (as the grader's temporary root would be),
the repository's solutions/, a port it listens on. A daemon the notebook double-forks must
not outlive the kernel. Then the refusal: `autograde` with no bubblewrap exits 2 naming it,
and UNSAFE grades, records and reports it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from grading_runs import FIXTURES_DIR, NO_SANDBOX, _submit, full_answers

from parlab.grading import REPO_ROOT, ResilientExecute, generate_release
from parlab.grading.autograde import kernels
from parlab.grading.sandbox import problem

pytestmark = pytest.mark.skipif(NO_SANDBOX, reason=f"no sandbox here: {problem()}")

MARK = "parlab-sandbox-test-daemon"
LOOK = '''
import json, os, socket, subprocess, sys
from pathlib import Path

def can_read(p):
    try:
        Path(p).read_bytes()
        return True
    except OSError:
        return False

def can_write(p):
    try:
        Path(p).write_text("PWNED")
        return True
    except OSError:
        return False

def can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False

from parlab.launch import run
import torch, torch.distributed as dist

def total():
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.tolist()

if os.fork() == 0:  # a daemon, double-forked, that would act after grading
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "300", "MARK"])
    os._exit(0)

print(json.dumps({
    "uid": os.getuid(), "cwd": os.getcwd(), "files": sorted(os.listdir(".")),
    "copied_from": sorted(os.listdir("/run/submission")),
    "env": sorted(os.environ), "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
    "solutions": os.path.exists("SOLUTIONS"),
    "canary": can_read("CANARY"), "write_canary": can_write("CANARY"),
    "write_outside": can_write("OUTSIDE/new.txt"), "write_lib": can_write("LIB/x.py"),
    "port": can_connect(PORT), "own_file": can_write("mine.txt"),
    "ranks": run(total, 2),
}))
'''


def _look(tmp_path, warm: bool, monkeypatch) -> tuple[dict, dict]:
    outside = tmp_path / "submission"
    outside.mkdir()
    (outside / "data.txt").write_text("the learner's own file")
    # what nbgrader writes there before running it: the notebook, hidden tests restored
    (outside / "graded.ipynb").write_text("### BEGIN HIDDEN TESTS")
    canary = tmp_path / "canary.txt"
    canary.write_text("the grader's")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    source = (LOOK.replace("SOLUTIONS", str(REPO_ROOT / "solutions")).replace("CANARY", str(canary))
              .replace("OUTSIDE", str(outside)).replace("LIB", str(REPO_ROOT / "lib" / "parlab"))
              .replace("PORT", str(listener.getsockname()[1])).replace("MARK", MARK))
    # the look, then a kernel that dies: its sandbox must be closed all the same
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source),
                                         nbformat.v4.new_code_cell("import os; os._exit(1)")])
    executor = ResilientExecute(timeout=60, warm_kernels=warm, sandbox=True)
    made: list[Path] = []  # the stage folder of each sandbox this notebook's kernels had

    class Recorded(kernels.Sandbox):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self.stage)

    monkeypatch.setattr(kernels, "Sandbox", Recorded)
    env = {"PARLAB_GRADE_RUN": "secret-run", "JPY_PARENT_PID": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        nb, _ = executor.preprocess(nb, {"metadata": {"path": str(outside)}})
    finally:
        listener.close()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    left = [stage for stage in made if stage.exists()]
    assert made, "no sandbox was made"
    assert not left, f"sandboxes left behind after the notebook: {left}"
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    assert text, f"the notebook printed nothing: {outputs}"
    return json.loads(text.strip().splitlines()[-1]), {
        "canary": canary.read_text(), "outside": sorted(p.name for p in outside.iterdir()),
        "died": nb.cells[1].outputs[-1].get("ename")}


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_sandboxed_kernel_sees_and_reaches_only_its_own(tmp_path, warm, monkeypatch) -> None:
    seen, after = _look(tmp_path, warm, monkeypatch)
    assert seen["uid"] == (65534 if os.geteuid() == 0 else os.getuid())
    assert seen["cwd"] == "/home/learner/submission" and "data.txt" in seen["files"], seen
    assert "graded.ipynb" not in seen["files"] + seen["copied_from"], "it can read the notebook "
    "nbgrader runs, hidden tests included"
    assert not seen["solutions"], "the kernel could see the repository's solutions/"
    assert not seen["canary"] and not seen["write_canary"], "it reached the grader's files"
    assert not seen["write_outside"] and not seen["write_lib"], "it wrote outside its copy"
    assert seen["own_file"], "it could not write in its own folder"
    assert after == {"canary": "the grader's", "outside": ["data.txt", "graded.ipynb"],
                     "died": "KernelDied"}, after
    assert not seen["port"], "it reached a TCP port of the grader's network"
    assert not {"PARLAB_GRADE_RUN", "JPY_PARENT_PID", "PARLAB_KERNEL"} & set(seen["env"])
    assert seen["pids"] < 20, f"it sees {seen['pids']} processes: not its own PID namespace"
    assert seen["ranks"] == [[3.0, 3.0], [3.0, 3.0]], "ranks could not meet on loopback"
    deadline = time.monotonic() + 5
    while _daemons() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _daemons(), "a double-forked daemon outlived its kernel's sandbox"


def _daemons() -> list[int]:
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if MARK.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def _cli(root, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root), *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
                          env=dict(os.environ, **(env or {})))


SMOKE = "nbgrader_smoke"


def test_without_a_sandbox_autograde_refuses_and_unsafe_is_recorded(tmp_path) -> None:
    root, module = tmp_path / "course", SMOKE  # a module of seconds: it is graded twice
    (root / "solutions").mkdir(parents=True)
    shutil.copytree(FIXTURES_DIR / module, root / "solutions" / module)
    generate_release(module, root=root)
    _submit(root, "alice", module, full_answers(root, module))
    source = nbformat.read(str(root / "solutions" / module / f"{module}.ipynb"), as_version=4)
    full_marks = sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in source.cells
                     if c.metadata.get("nbgrader", {}).get("grade"))
    missing = {"PARLAB_BWRAP": str(tmp_path / "no-bwrap")}
    refused = _cli(root, "autograde", env=missing)
    assert refused.returncode == 2 and "bubblewrap" in refused.stderr, refused
    assert "UNSAFE=1" in refused.stderr and not (root / "autograded").exists()
    graded = _cli(root, "autograde", "--unsafe", env=missing)
    assert graded.returncode == 0 and "WITHOUT the sandbox" in graded.stdout, graded
    record = json.loads((root / "autograded" / ".parlab" / "record.json").read_text())
    assert record[f"{module}/alice"]["sandbox"] is False
    assert record[f"{module}/alice"]["result"]["score"] == full_marks > 0
    exported = _cli(root, "export")
    assert "WITHOUT the sandbox" in exported.stdout and "alice" in exported.stdout, exported
    regraded = _cli(root, "autograde")  # a sandbox here: graded again, in it
    assert regraded.returncode == 0, regraded
    record = json.loads((root / "autograded" / ".parlab" / "record.json").read_text())
    assert record[f"{module}/alice"]["sandbox"] is True
    assert "WITHOUT" not in _cli(root, "export").stdout
