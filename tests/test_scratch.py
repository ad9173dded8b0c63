"""parlab.scratch: a scratch folder is gone when its process exits, and a killed process's
folder is swept by the next one; the notebooks make theirs with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
from conftest import ROOT

from parlab.scratch import scratch_dir, scratch_root

MAKE = ("import os, signal, sys\nfrom parlab.scratch import scratch_dir\n"
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
            "parlab.scratch.scratch_dir")
