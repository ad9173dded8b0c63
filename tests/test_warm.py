"""Warm kernels (parlab.grading.autograde.warm) grade exactly as fresh ones, and each submission
alone.

One grading process (a script, as an nbgrader worker is one process) runs ResilientExecute
over the same small notebooks twice, with fresh kernels and then warm ones forked from one
template: the notebooks' outputs and errors must be the same, cell for cell. Among them: a
submission that monkeypatches torch and sets globals, followed by one that must not see it; a
learner's own torch.py beside the notebook (imported in both modes: the warm path starts that
kernel cold); matplotlib (imported by the template, without pyplot): the inline backend and a
figure, and a learner's own matplotlibrc (that kernel starts cold); sys.exit and os._exit (a
restart, later cells still run); children left sleeping. When the grading process has ended,
no process of the run is left (the template included).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from parlab.grading import leftover_processes
from parlab.grading.engines.results import RUN_ENV

pytestmark = pytest.mark.slow

WARM_PROBE = "import sys\nprint('warm' if 'torch' in sys.modules else 'cold')"
NOTEBOOKS = {
    "leaks": [WARM_PROBE,
              "import builtins, os, torch, parlab\ntorch.add = lambda *a, **k: 'patched'\n"
              "builtins.LEAKED = parlab.LEAKED = 1\nos.environ['LEAKED'] = '1'\n"
              "torch.set_num_threads(1)\nprint('patched')"],
    "sees_no_leak": [WARM_PROBE,
                     "import builtins, os, torch, parlab\n"
                     "print(torch.add(torch.ones(1), 1).tolist(), hasattr(builtins, 'LEAKED'), "
                     "hasattr(parlab, 'LEAKED'), 'LEAKED' in os.environ)"],
    "own_torch": [WARM_PROBE, "import torch\nprint(getattr(torch, 'MINE', 'the real torch'))"],
    "plots": ["import matplotlib.pyplot as plt\nprint(plt.get_backend())",
              "import matplotlib\nprint(matplotlib.rcParams['lines.linewidth'])",
              "plt.plot([1, 2]); plt.show()"],
    "own_matplotlibrc": ["import matplotlib\nprint(matplotlib.rcParams['lines.linewidth'])"],
    "exits": ["import sys\nsys.exit(3)", "print('after sys.exit')",
              "import os\nos._exit(1)", "print('after os._exit')"],
    "leaves_children": [
        "import os, subprocess, time\nsubprocess.Popen(['sleep', '300'])\n"
        "if os.fork() == 0:\n    time.sleep(300)\n    os._exit(0)\nprint('left')",
        "print('done')"],
}

SCRIPT = r"""
import json, sys, nbformat
from parlab.grading.autograde.execute import ResilientExecute

folders = json.loads(sys.argv[1])
seen = {}
for warm in (False, True):
    executor = ResilientExecute(warm_kernels=warm, timeout=30, submission_timeout=120)
    for name, folder in folders.items():
        nb = nbformat.read(folder + "/nb.ipynb", as_version=4)
        nb, _ = executor.preprocess(nb, {"metadata": {"path": folder}})
        seen[f"{'warm' if warm else 'cold'}/{name}"] = [
            [[o.get("ename") or o.get("output_type"), o.get("text", "").strip()]
             for o in c.outputs] for c in nb.cells]
print(json.dumps(seen))
"""


def _graded(tmp_path: Path, token: str) -> dict[str, list]:
    folders = {}
    for name, cells in NOTEBOOKS.items():
        folder = tmp_path / name
        folder.mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nbformat.write(nb, str(folder / "nb.ipynb"))
        folders[name] = str(folder)
    (tmp_path / "own_torch" / "torch.py").write_text("MINE = \"the learner's torch.py\"\n")
    (tmp_path / "own_matplotlibrc" / "matplotlibrc").write_text("lines.linewidth: 7\n")
    env = dict(__import__("os").environ, **{RUN_ENV: token})
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(folders)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[dict[str, list], list[int]]:
    token = uuid.uuid4().hex
    seen = _graded(tmp_path_factory.mktemp("warm"), token)
    return seen, leftover_processes(token)


def _text(cells: list, index: int) -> str:
    return " ".join(text for _, text in cells[index])


def test_warm_kernels_were_warm_and_fresh_ones_fresh(graded) -> None:
    seen, _ = graded
    for name in ("leaks", "sees_no_leak"):
        assert _text(seen[f"cold/{name}"], 0) == "cold"
        assert _text(seen[f"warm/{name}"], 0) == "warm", "the warm kernel was not forked"


def test_warm_outputs_equal_fresh_ones_cell_for_cell(graded) -> None:
    seen, _ = graded
    for name in NOTEBOOKS:
        cold, warm = seen[f"cold/{name}"], seen[f"warm/{name}"]
        if name != "own_torch":
            cold, warm = cold[1:], warm[1:]  # the probe differs, by design
        assert warm == cold, f"{name}: warm kernels gave {warm}, fresh ones {cold}"


def test_no_submission_sees_another_ones_state(graded) -> None:
    seen, _ = graded
    assert _text(seen["warm/leaks"], 1) == "patched"
    assert _text(seen["warm/sees_no_leak"], 1) == "[2.0] False False False"


def test_a_learners_torch_py_is_imported_as_in_a_fresh_kernel(graded) -> None:
    seen, _ = graded
    for mode in ("cold", "warm"):
        assert _text(seen[f"{mode}/own_torch"], 0) == "cold", f"{mode}: started warm"
        assert _text(seen[f"{mode}/own_torch"], 1) == "the learner's torch.py"


def test_matplotlib_in_a_warm_kernel_is_as_in_a_fresh_one(graded) -> None:
    seen, _ = graded
    for mode in ("cold", "warm"):
        plots = seen[f"{mode}/plots"]
        assert _text(plots, 0) == "module://matplotlib_inline.backend_inline", mode
        assert [kind for kind, _ in plots[2]] == ["display_data"], f"{mode}: no figure shown"
        assert _text(seen[f"{mode}/own_matplotlibrc"], 0) == "7.0", (
            f"{mode}: the learner's matplotlibrc was not read")


def test_exits_restart_the_kernel_and_later_cells_run(graded) -> None:
    seen, _ = graded
    cells = seen["warm/exits"]
    assert cells[1] == [["stream", "after sys.exit"]]
    assert cells[2][-1][0] == "KernelDied" and cells[3] == [["stream", "after os._exit"]]


def test_no_process_outlives_the_grading_process(graded) -> None:
    _, leftover = graded
    assert leftover == [], f"processes left behind: {leftover}"
