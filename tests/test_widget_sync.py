"""parlab.grading.base.widget_sync: an Output widget's outputs are kept, and nothing is echoed
to the kernel on the shell socket, where the echo could hide a cell's reply until its timeout.

The unit test drives the widget stand-ins directly (nbclient's own one sends a comm message
per output, ours none). The notebook tests run a notebook of Output widgets that redraw a
figure at the end of each cell, the pattern of the course's widgets: through the grader's
executor (in its own process, as nbgrader runs it) and `execute_notebook`, each finishing
clean, every figure in its widget (the grader's executor keeps them in its widget state).
Three stock nbclient runs of the same notebook side by side stalled a cell for its whole
timeout in about one run of three on 2 cores (measured while writing this), so the timing
bound below is what a stall breaks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient.output_widget import OutputWidget

from parlab.grading import execute_notebook
from parlab.grading.base.widget_sync import BatchOutputWidget

TIMEOUT_S = 30
CELLS = 8
REDRAW = """\
out{k} = widgets.Output()
display(out{k})
for i in range(3):
    with out{k}:
        out{k}.clear_output(wait=True)
        fig, ax = plt.subplots()
        ax.plot(range(10 + i))
        display(fig)
        plt.close(fig)"""
GRADER = """
import json, sys, nbformat
from nbclient.output_widget import OutputWidget
from parlab.grading.autograde.execute import ResilientExecute
echoes = []
OutputWidget.sync_state = lambda self: echoes.append(1)  # nbclient's echo, if it ran
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
executor = ResilientExecute(timeout={timeout}, submission_timeout=300)
folder = str(__import__("pathlib").Path(path).parent)
nb, _ = executor.preprocess(nb, {{"metadata": {{"path": folder}}}})
nbformat.write(nb, path)
print(json.dumps([len(echoes)] + [s["outputs"] for s in executor.widget_state.values()
                                  if "outputs" in s]))
"""


class _Shell:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, msg: dict) -> None:
        self.sent.append(msg)


class _Client:
    def __init__(self) -> None:
        from jupyter_client.session import Session

        self.session, self.shell_channel = Session(), _Shell()


class _Executor:
    def __init__(self) -> None:
        self.widget_state: dict[str, dict] = {"w": {}}


def _stream(text: str) -> dict:
    return {"msg_type": "stream", "parent_header": {}, "header": {"msg_type": "stream"},
            "content": {"name": "stdout", "text": text}}


def test_batch_widget_keeps_the_outputs_and_sends_nothing():
    sent = {}
    for cls in (OutputWidget, BatchOutputWidget):
        client, executor = _Client(), _Executor()
        widget = cls("w", {"outputs": []}, client, executor)
        for text in ("a\n", "b\n"):
            widget.output([], _stream(text), None, 0)
        assert executor.widget_state["w"]["outputs"][0]["text"] == "a\nb\n", cls.__name__
        sent[cls.__name__] = [m["msg_type"] for m in client.shell_channel.sent]
    assert sent == {"OutputWidget": ["comm_msg", "comm_msg"], "BatchOutputWidget": []}, sent


def _widget_notebook(path: Path) -> Path:
    cells = [nbformat.v4.new_code_cell(
        "import ipywidgets as widgets\nimport matplotlib.pyplot as plt\n"
        "from IPython.display import display")]
    for k in range(CELLS):
        cells += [nbformat.v4.new_code_cell(REDRAW.format(k=k)),
                  nbformat.v4.new_code_cell(f"x = {k}")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
    return path


def _assert_clean(nb: nbformat.NotebookNode, where: str) -> None:
    """No error, and no figure in a cell's own outputs: each went to its Output widget."""
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert not errors, f"{where}: {errors}"
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert not figures, f"{where}: {len(figures)} figures landed in the cells, not the widgets"


def test_grader_runs_output_widgets_without_stalling(tmp_path):
    path = _widget_notebook(tmp_path / "widgets.ipynb")
    proc = subprocess.run([sys.executable, "-c", GRADER.format(timeout=TIMEOUT_S), str(path)],
                          capture_output=True, text=True, timeout=CELLS * TIMEOUT_S + 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nb = nbformat.read(str(path), as_version=4)
    _assert_clean(nb, "ResilientExecute")
    echoes, *kept = json.loads(proc.stdout.splitlines()[-1])
    assert echoes == 0, f"nbclient's Output widget echoed {echoes} times to the kernel"
    with_figure = [o for o in kept if any("image/png" in x.get("data", {}) for x in o)]
    assert len(with_figure) == CELLS, f"{len(with_figure)} of {CELLS} widgets kept a figure"
    took = nb.metadata["parlab"]["grading"]["seconds"]
    assert took < TIMEOUT_S, f"the notebook took {took} s: a cell waited out its timeout"


def test_execute_notebook_runs_output_widgets_without_stalling(tmp_path, monkeypatch):
    echoes: list[int] = []
    monkeypatch.setattr(OutputWidget, "sync_state", lambda self: echoes.append(1))
    start = time.monotonic()
    nb = execute_notebook(_widget_notebook(tmp_path / "widgets.ipynb"), timeout=TIMEOUT_S)
    took = time.monotonic() - start
    _assert_clean(nb, "execute_notebook")
    assert not echoes, f"nbclient's Output widget echoed {len(echoes)} times to the kernel"
    assert took < TIMEOUT_S, f"the notebook took {took:.0f} s: a cell waited out its timeout"
