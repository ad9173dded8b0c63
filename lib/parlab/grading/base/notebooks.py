"""Notebook files as the grader meets them: whether one can be read, and running one.

`unreadable_reason` says why a submitted file cannot be graded as written (cut short, not
JSON, not a notebook); `execute_notebook` runs every cell the way nbgrader's autograder does,
for tools that want a notebook's verdicts without the gradebook (scripts/gpu_check.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode

from parlab.grading.base.widget_sync import OUTPUT_WIDGETS

# The ename a cell gets when execute_notebook (like nbgrader) gives up waiting for it.
TIMEOUT_ENAME = "CellTimeoutError"
# Set to 1 in the environment of every kernel the self-check and execute_notebook start:
# `parlab.grading.standing()` in such a kernel skips instead of starting a self-check itself.
SELFCHECK_ENV = "PARLAB_SELFCHECK"


def unreadable_reason(path: Path) -> str | None:
    """Why a submitted notebook cannot be graded as written, or None."""
    try:
        data = json.loads(Path(path).read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
            return "it is JSON, but not a notebook: it has no list of cells"
    except UnicodeDecodeError as exc:
        return f"it is not text: {exc.reason} at byte {exc.start}"
    except json.JSONDecodeError as exc:
        return f"its JSON breaks at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    try:
        nbformat.read(str(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - whatever is wrong, say it
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return None


def _record_timeout(cell: NotebookNode, cell_index: int, execute_reply: dict) -> None:
    """on_cell_executed hook: nbclient's stand-in reply for a timed-out cell is not in its
    outputs; add it (as nbgrader's Execute does) so the cell shows the error."""
    content = execute_reply.get("content", {})
    if content.get("status") != "error":
        return
    if not any(o.get("output_type") == "error" and o.get("ename") == content.get("ename")
               for o in cell.get("outputs", [])):
        cell.outputs.append(nbformat.v4.new_output(
            "error", ename=content.get("ename", ""), evalue=content.get("evalue", ""),
            traceback=content.get("traceback", [])))


def execute_notebook(path: Path | str, *, timeout: float = 60, cwd: Path | str | None = None,
                     kernel_name: str = "") -> NotebookNode:
    """Run every cell like nbgrader's autograder: errors are recorded and execution goes on.

    A cell still running after `timeout` seconds is interrupted and gets a CellTimeoutError
    output; a dead kernel marks the running cell DeadKernelError and leaves the rest unrun.
    cwd: the kernel's working directory (default: the notebook's folder).
    """
    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
        # After an interrupt, wait briefly for the kernel to settle; if it does not (a rank
        # ignoring SIGINT), raise instead of letting every later cell time out in turn.
        raise_on_iopub_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": f"no reply within {timeout} s",
                          "traceback": [f"{TIMEOUT_ENAME}: no reply within {timeout} s"]},
        kernel_name=kernel_name or nb.metadata.get("kernelspec", {}).get("name", "python3"),
        resources={"metadata": {"path": str(Path(cwd) if cwd else path.parent)}},
        on_cell_executed=_record_timeout,
    )
    client.widget_registry = dict(OUTPUT_WIDGETS)  # parlab.grading.base.widget_sync
    with client.setup_kernel(env=dict(os.environ, **{SELFCHECK_ENV: "1"})):
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
            except (DeadKernelError, CellTimeoutError) as exc:
                cell.outputs.append(nbformat.v4.new_output(
                    "error", ename=type(exc).__name__, evalue=str(exc), traceback=[str(exc)]))
                break
    return nb


def kernel_metadata(kernel_name: str = "python3") -> dict:
    """The notebook metadata JupyterLab writes when it connects a kernel: {"kernelspec",
    "language_info"}, asked of a fresh kernel. JupyterLab compares both with what a notebook
    stores (deep equality) and marks the notebook modified when they differ, so a notebook
    that stores these exactly is not "modified" just by being opened (with this Python: the
    version is part of language_info)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=kernel_name,
                              extra_arguments=["--IPKernelApp.log_level=ERROR"])
    try:
        info = kc.kernel_info(reply=True, timeout=60)["content"]["language_info"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    spec = km.kernel_spec
    if spec is None:
        raise RuntimeError(f"no kernel spec named {kernel_name!r}: install ipykernel in this venv")
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language,
                           "name": kernel_name},
            "language_info": info}
