"""ResilientExecute starts the kernel again when it dies before answering (nbgrader would drop
the submission: "Kernel died before replying to kernel_info"), and after START_RETRIES more
failures scores every cell 0 with the reason instead. The kernel managers below die at launch
on purpose: the first launch only, or every one."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat

SCRIPT = r"""
import json, sys
import nbformat
from jupyter_client.manager import AsyncKernelManager
from parlab.grading.autograde.execute import ResilientExecute

class DiesAtLaunch(AsyncKernelManager):
    launches = 0
    dying = int(sys.argv[2])  # how many launches die before answering

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        DiesAtLaunch.launches += 1
        if DiesAtLaunch.launches <= self.dying:
            kernel_cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
        await super()._async_launch_kernel(kernel_cmd, **kw)

nb = nbformat.read(sys.argv[1], as_version=4)
executor = ResilientExecute(kernel_manager_class=DiesAtLaunch, warm_kernels=False, timeout=30,
                            submission_timeout=120)
nb, _ = executor.preprocess(nb, {"metadata": {"path": "."}})
print(json.dumps({"launches": DiesAtLaunch.launches,
                  "cells": [[f"{o.ename}: {o.evalue}" if o.get("ename") else o.text.strip()
                             for o in c.outputs] for c in nb.cells]}))
"""


def _graded(tmp_path, dying: int) -> dict:
    path = tmp_path / "nb.ipynb"
    cells = [nbformat.v4.new_code_cell("print('one')"), nbformat.v4.new_code_cell("print('two')")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(dying)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_kernel_that_dies_at_launch_is_started_again(tmp_path):
    got = _graded(tmp_path, dying=1)
    assert got == {"launches": 2, "cells": [["one"], ["two"]]}, got


def test_a_kernel_that_never_starts_scores_each_cell_with_the_reason(tmp_path):
    got = _graded(tmp_path, dying=99)
    assert got["launches"] == 3 and all(
        len(cell) == 1 and cell[0].startswith("NotRun:") and "the kernel did not start" in cell[0]
        for cell in got["cells"]), got
