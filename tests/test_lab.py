"""JupyterLab as learners and instructors get it, and the formgrader's feedback path.

- The notebooks store the kernelspec and language_info a kernel reports, which JupyterLab
  compares (deep equality) on opening and otherwise writes, marking the notebook modified.
- `make lab`: nbgrader's Validate is served, nothing an instructor uses is (no formgrader, no
  Assignment or Course list, whose lab plugins are disabled with Create Assignment and the
  nbgrader menu), and the news pop-up's plugin is off. Validate's reply is wrapped to fit its
  dialog and its button shows progress (parlab.grading.learner.validate_button: the text here, the
  dialog and the button in Chromium in tests/test_browser.py).
- `make formgrader` serves the formgrader on a course root (here the graded class of
  tests/grading_runs.py); its "Generate Feedback" (the formgrader API call the button makes)
  writes feedback through the course's configuration: the hidden-test placeholder is there
  and no hidden test line is. nbgrader started in the repository root with no arguments
  reads the same configuration (./nbgrader_config.py).
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from grading_runs import FAULT_MODULE, FAULTS_DIR

from parlab.grading import COURSE_DIR, SOLUTIONS_DIR, distinctive_hidden_lines, leaks
from parlab.grading.base.notebooks import kernel_metadata
from parlab.grading.feedback.hidden import PLACEHOLDER
from parlab.grading.learner.validate_button import CUSTOM_CSS, RUNNING, WIDTH, readable

TOKEN = "parlab-test-token"
PROBE = "fault-hidden-test-fails"  # the class member whose failing test quotes a hidden line
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_notebooks_store_what_the_kernel_reports() -> None:
    wanted = kernel_metadata()
    notebooks = sorted(p for top in (SOLUTIONS_DIR, COURSE_DIR) for p in top.glob("*/*.ipynb"))
    assert notebooks
    bad = []
    for path in notebooks:
        meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        info = dict(meta.get("language_info", {}))
        if meta.get("kernelspec") != wanted["kernelspec"]:
            bad.append(f"{path.relative_to(ROOT)}: kernelspec {meta.get('kernelspec')}")
        # the version is this Python's; the course's (environment.yml) is what is stored
        if not info.pop("version", None) or info != {
                k: v for k, v in wanted["language_info"].items() if k != "version"}:
            bad.append(f"{path.relative_to(ROOT)}: language_info {meta.get('language_info')}")
    assert not bad, ("JupyterLab would mark these modified on opening; run "
                     "`.venv/bin/python scripts/stamp_notebooks.py`:\n" + "\n".join(bad))


# --- servers ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     headers={"Authorization": f"token {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Server:
    """`make <target> ...` serving JupyterLab on a free port; stopped with its whole group."""

    def __init__(self, target: str, *make_vars: str) -> None:
        self.port = _free_port()
        args = f"--no-browser --port={self.port} --IdentityProvider.token={TOKEN}"
        env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
        self.proc = subprocess.Popen(["make", target, *make_vars, f"ARGS={args}"], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if _get(self.port, "/api/status")[0] == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, self.proc.stdout.read().decode()
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"`make {target}` did not serve within 90 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _page_config(html: str) -> dict:
    start = html.index('id="jupyter-config-data"')
    body = html[html.index(">", start) + 1:]
    return json.loads(body[:body.index("</script>")])


@pytest.mark.slow
def test_make_lab_serves_validate_and_nothing_an_instructor_uses(tmp_path: Path) -> None:
    server = Server("lab", f"WORKSPACE={tmp_path / 'workspace'}")
    try:
        assert _get(server.port, "/nbgrader_version?version=0")[0] != 404, "no Validate"
        for path in ("/formgrader", "/assignments", "/courses"):
            assert _get(server.port, path)[0] == 404, f"{path} is served to learners"
        config = _page_config(_get(server.port, "/lab")[1])
        css = _get(server.port, "/custom/custom.css")[1]
    finally:
        server.stop()
    disabled = set(config["disabledExtensions"])
    for plugin in ("formgrader", "create-assignment", "assignment-list", "course-list", "menu"):
        assert f"@jupyter/nbgrader:{plugin}" in disabled, f"learners see nbgrader's {plugin}"
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    assert "@jupyterlab/apputils-extension:announcements" in disabled, "the news pop-up is on"
    assert config.get("news", {}).get("disabled") is True
    assert RUNNING in css, "no progress line for Validate in the learner's custom CSS"


def test_validate_reply_fits_its_dialog() -> None:
    """What Validate's dialog shows (nbgrader's reply, through parlab's handler): every line of
    a failed cell's source and error at most WIDTH columns (the dialog cuts what is wider),
    no word lost, the error as HTML-escaped text; the validator's own failure likewise."""
    hint = ("Likely mistake: send chunks to your right neighbour with dist.isend (or "
            "dist.send) and receive from the left with dist.irecv (or dist.recv) <here>")
    source = "check_ring_allreduce(ring_allreduce, world_size=3, numel=100, seed=5, quiet=True)" \
        "  # uneven chunks"
    raw = f"\x1b[0;31mCheckFailed\x1b[0m: rank 0: ring_allreduce sent nothing\n{hint}"
    reply = {"success": True, "value": {"failed": [
        {"source": source, "error": "<span>ansi html</span>", "raw_error": raw}]}}
    cell = readable(reply)["value"]["failed"][0]
    for text in (cell["source"], cell["raw_error"]):
        assert all(len(line) <= WIDTH for line in text.split("\n")), text
    assert cell["source"].split() == source.split()
    assert cell["raw_error"].split() == ANSI.sub("", raw).split()
    assert cell["raw_error"].split("\n")[2].startswith("    dist.send)"), cell["raw_error"]
    assert cell["error"] == html.escape(cell["raw_error"]) and "&lt;here&gt;" in cell["error"]
    assert f'content: "{RUNNING}"' in CUSTOM_CSS.read_text(), "the button's line is not RUNNING"
    broken = readable({"success": False, "value": "Traceback ...\n" + "x" * 200})
    assert not broken["success"] and max(map(len, broken["value"].split("\n"))) <= WIDTH


def _hidden() -> set[str]:
    return distinctive_hidden_lines(nbformat.read(
        str(FAULTS_DIR / FAULT_MODULE / f"{FAULT_MODULE}.ipynb"), as_version=4))


def _feedback(root: Path, folder: str) -> str:
    return (root / folder / PROBE / FAULT_MODULE / f"{FAULT_MODULE}.html").read_text()


@pytest.mark.slow
def test_formgrader_feedback_shows_no_hidden_test(fault_run) -> None:
    root = fault_run.root
    html = root / "feedback" / PROBE / FAULT_MODULE / f"{FAULT_MODULE}.html"
    html.unlink(missing_ok=True)
    server = Server("formgrader", f"COURSE_ROOT={root}")
    try:
        assert _get(server.port, "/formgrader")[0] == 200, "no formgrader"
        status, body = _get(server.port, f"/formgrader/api/assignment/{FAULT_MODULE}/{PROBE}/"
                            "generate_feedback", method="POST")
    finally:
        server.stop()
    assert status == 200 and json.loads(body)["success"], body[-3000:]
    page = _feedback(root, "feedback")
    assert PLACEHOLDER in page, "formgrader's feedback did not go through HideHiddenTests"
    assert not leaks(page, _hidden()), f"formgrader's feedback shows {leaks(page, _hidden())}"


@pytest.mark.slow
def test_nbgrader_in_the_repository_root_reads_the_course_config(fault_run) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_feedback", FAULT_MODULE, "--force",
         f"--CourseDirectory.student_id={PROBE}", "--CourseDirectory.feedback_directory=plain",
         f"--CourseDirectory.root={fault_run.root}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = _feedback(fault_run.root, "plain")
    assert PLACEHOLDER in page, "nbgrader in the repository root ran with its own defaults"
    assert not leaks(page, _hidden())
