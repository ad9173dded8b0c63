"""Feedback without hidden tests: not in the cells, not in tracebacks, not in any output.

nbgrader's feedback HTML shows the autograded notebook, hidden tests included; removing the
hidden region from the source (nbgrader's ClearHiddenTests) is not enough, because a traceback
quotes the failing line and the lines around it, and a rank's traceback inside a parlab error
quotes the source of the function that ran there. `HideHiddenTests` (a GenerateFeedback
preprocessor, see autograder/nbgrader_config.py):

- replaces each `### BEGIN HIDDEN TESTS ... ### END HIDDEN TESTS` region with one comment line;
- strips ANSI colours from every text output and traceback, and drops each line that contains
  a hidden-test line (compared with whitespace collapsed).

`leaks(html, lines)` says which hidden-test lines can still be read in a page (the tests' check).
What no feedback file may show at all (hidden-test lines, and solution-only lines the student
did not write), and the guard that applies it wherever nbgrader writes feedback, formgrader
included, are in parlab.grading.feedback.leakcheck; parlab.grading.feedback.withhold's `write_feedback` is the
instructor's `feedback` command: nbgrader generate_feedback under that guard, then every
file checked again.
"""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Iterable

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

BEGIN, END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
MIN_CHARS = 6  # shorter hidden lines (")", "pass") say nothing and are not looked for
PLACEHOLDER = "# (hidden tests ran here; they are not shown)"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def split_hidden(source: str) -> tuple[str, list[str]]:
    """(source with each hidden region replaced by PLACEHOLDER, the hidden lines)."""
    kept, hidden, inside = [], [], False
    for line in source.split("\n"):
        if BEGIN in line:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(indent + PLACEHOLDER)
        elif END in line:
            inside = False
        elif inside:
            hidden.append(line)
        else:
            kept.append(line)
    return "\n".join(kept), hidden


def hidden_lines(nb: NotebookNode) -> set[str]:
    """Every hidden-test line of the notebook, whitespace collapsed, at least MIN_CHARS long."""
    found = set()
    for cell in nb.cells:
        for line in split_hidden(cell.source)[1]:
            if len(norm := normalise(line)) >= MIN_CHARS:
                found.add(norm)
    return found


def distinctive_hidden_lines(nb: NotebookNode) -> set[str]:
    """Hidden lines that appear nowhere else in the notebook's visible source: finding one in
    a learner's file can only mean the hidden test leaked."""
    visible = "\n".join(normalise(split_hidden(c.source)[0]) for c in nb.cells)
    return {line for line in hidden_lines(nb) if line not in visible}


def scrub(text: str, lines: Iterable[str]) -> str:
    """`text` without ANSI codes and without any line that contains one of `lines`."""
    lines = [ln for ln in lines if ln]
    kept = [ln for ln in _ANSI.sub("", text).split("\n")
            if not any(hidden in normalise(ln) for hidden in lines)]
    return "\n".join(kept)


def html_text(page: str) -> str:
    """The readable text of an HTML page, whitespace collapsed (tags and entities resolved)."""
    page = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", page)
    return normalise(html_lib.unescape(re.sub(r"<[^>]+>", "", page)))


def leaks(page: str, lines: Iterable[str]) -> list[str]:
    """The hidden-test lines that can be read in an HTML page."""
    text = html_text(page)
    return sorted(line for line in lines if line in text)


class HideHiddenTests(NbGraderPreprocessor):
    """Remove hidden tests from sources and from every output (see the module doc)."""

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        lines = hidden_lines(nb)
        for cell in nb.cells:
            cell.source = split_hidden(cell.source)[0]
            for output in cell.get("outputs", []):
                _scrub_output(output, lines)
        return nb, resources


def _scrub_output(output: NotebookNode, lines: set[str]) -> None:
    kind = output.get("output_type")
    if kind == "stream":
        output["text"] = scrub(output.get("text", ""), lines)
    elif kind == "error":
        output["evalue"] = scrub(output.get("evalue", ""), lines)
        output["traceback"] = [t for t in (scrub(t, lines) for t in output.get("traceback", []))
                               if t.strip()]
    elif kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        for mime, value in list(data.items()):
            if mime.startswith("text/"):
                text = "".join(value) if isinstance(value, list) else str(value)
                data[mime] = scrub(text, lines)
