"""nbclient's stand-in for an ipywidgets Output widget, without the echo that stalls a cell.

nbclient mimics a browser's Output widget: each output captured inside `with out:` is sent
back to the kernel as a comm message on the shell socket, while nbclient awaits the cell's
execute_reply on that same socket. zmq signals readiness edge-triggered, and such a send can
swallow the wake-up for the reply: nbclient then sleeps out the cell's whole timeout (60 s
under autograder/nbgrader_config.py) before it reads a reply that came long before
(jupyter/nbclient#312). It happened to one widget cell in a few of every course run
(modules 01, 04 and 07 draw their widgets into Output widgets); tests/test_widget_sync.py
provokes it.

In a batch run nothing in the kernel reads that echo (only a browser displays the widget), so
`BatchOutputWidget` keeps the outputs in the notebook's widget state, as nbclient's does, and
sends nothing. The grader (parlab.grading.autograde.execute) and `execute_notebook` both use it.
"""

from __future__ import annotations

from nbclient.output_widget import OutputWidget


class BatchOutputWidget(OutputWidget):
    """nbclient's OutputWidget, minus the state it sends back to the kernel."""

    def sync_state(self) -> None:
        """Send nothing: the outputs stay in the executor's widget state (module docstring)."""


# NotebookClient.widget_registry with it: {model module: {model name: class}}
OUTPUT_WIDGETS = {"@jupyter-widgets/output": {"OutputModel": BatchOutputWidget}}
