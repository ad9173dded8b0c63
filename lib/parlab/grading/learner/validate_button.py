"""nbgrader's Validate button as a learner meets it in JupyterLab (`make lab`, the hub).

nbgrader's lab extension saves the notebook, posts it to /assignments/validate and waits
while the server runs every cell again in a fresh kernel (16-60 s on 2 cores), then shows
each failed test cell's source and error in a dialog. Two things in it are ours to fix:

- the dialog's <pre> blocks neither wrap nor scroll, and the dialog is at most 1000 px wide:
  a line longer than about 90 characters is cut off ("...then run the test cel"). `readable`
  wraps every line of what the validator returns to `WIDTH` columns (a wrapped line goes on
  indented), so the whole message reads in any dialog at least 700 px wide;
- while it runs, the button only reads "Validating...": lab_custom/custom.css (JupyterLab's
  custom CSS, `LabApp.custom_css`) turns a disabled Validate button into a spinner and a
  line saying what runs and how long it takes (`RUNNING`).

This server extension serves nbgrader's two Validate routes (`/assignments/validate` with
`readable` applied, and `/nbgrader_version`) in place of nbgrader's validate_assignment
extension: autograder/jupyter/*/jupyter_server_config.json enable it instead of nbgrader's.
"""

from __future__ import annotations

import html
import re
import textwrap
from pathlib import Path
from typing import Any

__all__ = ["WIDTH", "RUNNING", "CUSTOM_CSS", "readable", "wrap"]

WIDTH = 80  # columns: the dialog's <pre> holds about 90 monospace characters at 1000 px
RUNNING = "every cell runs again in a fresh kernel: usually under a minute"
CUSTOM_CSS = Path(__file__).with_name("lab_custom") / "custom.css"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def wrap(text: str, width: int = WIDTH) -> str:
    """Every line of `text` at most `width` columns: a longer one is broken at spaces (inside
    a word only when it has none), its continuation indented four columns more than it."""
    out: list[str] = []
    for line in _ANSI.sub("", text).expandtabs(4).split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())][:width // 2]
        out += textwrap.wrap(line, width, subsequent_indent=lead + "    ",
                             break_on_hyphens=False, drop_whitespace=True) or [line[:width]]
    return "\n".join(out)


def readable(reply: dict[str, Any], width: int = WIDTH) -> dict[str, Any]:
    """nbgrader's Validate reply ({"success": bool, "value": result or an error's text}) with
    every source and error wrapped to `width` columns; the dialog shows `error` as HTML."""
    value = reply.get("value")
    if not isinstance(value, dict):  # the validator itself failed: its traceback, as text
        return {**reply, "value": wrap(str(value), width)}
    result: dict[str, Any] = {}
    for kind, cells in value.items():
        result[kind] = []
        for cell in cells:
            cell = dict(cell)
            if "source" in cell:
                cell["source"] = wrap(str(cell["source"]), width)
            if "raw_error" in cell or "error" in cell:
                raw = wrap(str(cell.get("raw_error", cell.get("error", ""))), width)
                cell["raw_error"], cell["error"] = raw, html.escape(raw)
            result[kind].append(cell)
    return {**reply, "value": result}


def _handlers() -> tuple[type, type]:
    from nbgrader.server_extensions.validate_assignment.handlers import (
        NbGraderVersionHandler,
        ValidateAssignmentHandler,
    )

    class ReadableValidateHandler(ValidateAssignmentHandler):
        """nbgrader's handler; its reply wrapped to fit the dialog."""

        def validate_notebook(self, path: str) -> dict[str, Any]:
            return readable(super().validate_notebook(path))

    return ReadableValidateHandler, NbGraderVersionHandler


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "parlab.grading.learner.validate_button"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.utils import url_path_join

    validate, version = _handlers()
    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    web_app.settings["root_dir"] = serverapp.root_dir  # what nbgrader's handler reads
    web_app.add_handlers(".*$", [(url_path_join(base, "assignments/validate"), validate),
                                 (url_path_join(base, "nbgrader_version"), version)])
    # LabApp serves /custom/custom.css (LabApp.custom_css) from this list, read per request
    web_app.settings["static_custom_path"].insert(0, str(CUSTOM_CSS.parent))
    serverapp.log.info("parlab: Validate's results wrapped to %d columns; %s", WIDTH,
                       CUSTOM_CSS)
