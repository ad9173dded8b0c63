"""The two-command setup: environment.yml mirrors pyproject, `make lab` serves JupyterLab."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

from conftest import ROOT


def _pip_lines(text: str) -> list[str]:
    """The requirement lines under `- pip:` in environment.yml (options and -e . left out)."""
    lines, inside = [], False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip() == "- pip:":
            inside = True
            continue
        if inside and line.strip().startswith("- "):
            item = line.strip()[2:].strip()
            if not item.startswith("-"):
                lines.append(item)
        elif inside and line.strip():
            inside = False
    return lines


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    got = _pip_lines((ROOT / "environment.yml").read_text())
    assert sorted(got) == sorted(wanted), (
        "environment.yml and pyproject.toml list different packages; keep them equal")


def test_readme_quick_start_is_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_jupyterlab(tmp_path):
    port = _free_port()
    args = f"--no-browser --ServerApp.port={port} --ServerApp.token= --ServerApp.ip=127.0.0.1"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.Popen(["make", "-s", "lab", f"ARGS={args}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        status, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=5) as r:
                    status = r.status
                    page = r.read().decode()
                break
            except OSError:
                time.sleep(1)
        assert status == 200, proc.stderr.read().decode()[-2000:] if proc.poll() else status
        assert "JupyterLab" in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5) as r:
            names = r.read().decode()
        for module in sorted(p.name for p in (ROOT / "course").iterdir() if p.is_dir()):
            assert module in names, f"course/{module} is not served in workspace/"
    finally:
        _stop(proc)
    assert Path(ROOT / ".venv" / ".installed").exists()


def _stop(proc: subprocess.Popen) -> None:
    """Stop make and the server it started (the whole session)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("system,works", [("Linux", True), ("Darwin", True),
                                           ("MINGW64_NT-10.0-19045", False),
                                           ("MSYS_NT-10.0-19045", False),
                                           ("CYGWIN_NT-10.0-19045", False)])
def test_make_says_in_one_line_where_the_course_cannot_run(tmp_path, system, works):
    """Native Windows (make under MSYS2, Git Bash or Cygwin: what `uname -s` says there) has no
    forkserver for the ranks: every target that needs the venv stops with one line naming
    WSL 2 and README's "Platforms", before creating anything; Linux and macOS go on. A fake
    `uname` on PATH stands for the system; `make -n` builds nothing."""
    fake = tmp_path / "uname"
    fake.write_text(f"#!/bin/sh\necho {system}\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for var in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):  # under `make test` a make of its own
        env.pop(var, None)                             # would say "Entering directory"
    for target in ("lab", "test"):
        proc = subprocess.run(["make", "-n", target], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
        said = proc.stderr.strip().splitlines()
        if works:
            assert proc.returncode == 0 and not said, proc.stderr
            continue
        assert proc.returncode == 2 and len(said) == 1 and not proc.stdout, proc
        assert "Linux and macOS" in said[0] and "WSL 2" in said[0] and system in said[0], said
    assert "Platforms" in (ROOT / "README.md").read_text()
