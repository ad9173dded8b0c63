"""parlab.launch.scratch: a scratch folder is gone when its process exits, and a killed process's
folder is swept by the next one; the notebooks make theirs with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from conftest import ROOT

from parlab.launch.scratch import scratch_dir, scratch_root

MAKE = ("import os, signal, sys\nfrom parlab.launch.scratch import scratch_dir\n"
        "p = scratch_dir('demo')\n(p / 'trace.json').write_text('{}')\nprint(p, flush=True)\n")


def _made(extra: str = "") -> tuple[Path, int]:
    proc = subprocess.run([sys.executable, "-c", MAKE + extra], capture_output=True, text=True,
                          timeout=60)
    return Path(proc.stdout.strip()), proc.returncode


def test_a_folder_goes_when_its_process_exits():
    folder, code = _made()
    assert code == 0 and folder.parent == scratch_root() and folder.name.split("-")[1] == "demo"
    assert not folder.exists(), f"{folder} outlived its process"


def test_a_killed_processs_folder_is_swept_by_the_next():
    folder, code = _made("os.kill(os.getpid(), signal.SIGKILL)\n")
    assert code == -9 and folder.exists(), "a killed process cannot clean up (the premise)"
    mine = scratch_dir("sweeper")
    assert not folder.exists(), f"{folder} of a dead process was not swept"
    assert mine.is_dir() and oct(scratch_root().stat().st_mode)[-3:] == "700"


def test_notebooks_make_their_folders_with_scratch_dir():
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "code")
        assert "mkdtemp" not in code and "TemporaryDirectory" not in code, (
            f"{path.name}: a folder in /tmp that outlives the kernel; use "
            "parlab.launch.scratch.scratch_dir")


def test_the_root_goes_with_the_last_process_that_left_it_empty(tmp_path):
    """The per-user root is removed at exit when this process's folders were the last in it,
    and kept while another process's folder is there (a private TMPDIR: other processes of
    this user share the real one)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    other = tmp_path / f"parlab-scratch-{os.getuid()}" / "1-theirs-x"
    proc = subprocess.run([sys.executable, "-c", MAKE], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0 and Path(proc.stdout.strip()).parent.parent == tmp_path
    assert not list(tmp_path.iterdir()), f"left: {list(tmp_path.rglob('*'))}"
    other.mkdir(parents=True)  # pid 1 runs: a folder that is not swept
    proc = subprocess.run([sys.executable, "-c", MAKE], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0 and list(tmp_path.rglob("*")) == [other.parent, other]
