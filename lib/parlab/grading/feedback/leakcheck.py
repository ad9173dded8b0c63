"""What a learner's feedback must not show, and the guard on every feedback file nbgrader writes.

Secret lines (whitespace collapsed, at least MIN_CHARS long) are of two kinds:
- hidden-test lines: `distinctive_hidden_lines` of the autograded notebook;
- solution-only lines (`solution_only_lines`): lines of the source's answers (`### BEGIN
  SOLUTION ... ### END SOLUTION`, or a whole solution cell without one, code or markdown)
  that can be read nowhere in the release (cells, outputs), in the source outside answers
  and hidden tests, or in lib/parlab (which learners have). "Read" compares whole texts,
  whitespace collapsed (backticks dropped too), so a line wrapped otherwise still counts.

The rule (`secret_lines`): in student S's feedback a hidden-test line always leaks; a
solution-only line leaks only if it cannot be read in what S handed in (`own_text`: the cell
sources of S's autograded notebook, hidden regions left out, and the files of S's submitted
folder, where alone an unreadable notebook's text is): a right answer often equals the
solution, and showing S what S wrote reveals nothing. A file that shows a leaking line (in
its readable text or anywhere in its markup) is withheld: not written, or deleted, with a
WITHHELD line naming S, the module and the line. No source notebook: withheld too.

`FeedbackGuard`, GenerateFeedback's exporter (autograder/nbgrader_config.py), so in every
path that writes feedback (`make feedback`, `nbgrader generate_feedback`, the formgrader's
button), checks each page after the preprocessors, before nbgrader writes it, and the files
nbgrader copied beside it; on a leak it logs the WITHHELD lines and raises: nbgrader counts
a failed submission, removes that student's module feedback and fails the run, the log
(the command's output, the formgrader's error) naming the file. `write_feedback` reads those
lines and then checks every file again (`scan_feedback`).
"""

from __future__ import annotations

import ast
import html as html_lib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import nbformat
from nbconvert.exporters import HTMLExporter
from nbformat import NotebookNode
from nbgrader.coursedir import CourseDirectory
from traitlets import Instance, default

from parlab.grading.feedback.hidden import (
    MIN_CHARS,
    distinctive_hidden_lines,
    html_text,
    normalise,
    split_hidden,
)
from parlab.grading.base.paths import REPO_ROOT

LIBRARY = REPO_ROOT / "lib" / "parlab"  # what the notebooks import: learners read it too

SOLUTION_BEGIN, SOLUTION_END = "BEGIN SOLUTION", "END SOLUTION"
SHOWN = 60  # characters of an offending line quoted in a WITHHELD line
_WITHHELD = re.compile(r"WITHHELD feedback of student '(?P<student>[^']*)', module "
                       r"'(?P<module>[^']*)' \((?P<path>[^)]*)\): (?P<kind>[\w-]+) line "
                       r"(?P<line>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_FAILED = re.compile(r"error processing assignment '(?P<module>[^']*)' for student "
                     r"'(?P<student>[^']*)'")
OWN_FILE_BYTES = 20 * 2**20  # a larger handed-in file is not read for the student's own text
_JSON_ESCAPE = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "t": "\t", "r": "\r"}
NO_SOURCE = "(the source notebook is missing: its solution lines cannot be checked)"


class FeedbackWithheld(RuntimeError):
    """Feedback that would show a secret line; the message holds one WITHHELD line a file."""


@dataclass(frozen=True)
class Withheld:
    """One withheld file: whose, which module, where, and the first line that leaked in it."""

    student: str
    module: str
    path: str
    kind: str  # "hidden-test", "solution" or "unchecked" (no source notebook)
    line: str

    def message(self) -> str:
        short = self.line if len(self.line) <= SHOWN else self.line[:SHOWN] + "..."
        return (f"WITHHELD feedback of student '{self.student}', module '{self.module}' "
                f"({self.path}): {self.kind} line {short!r}")


def _output_text(nb: NotebookNode) -> list[str]:
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            texts += [str(out.get("text", "")), str(out.get("evalue", ""))]
            texts += [str(t) for t in out.get("traceback", [])]
            texts += [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return texts


def _answers(cell: NotebookNode) -> tuple[list[str], list[str]]:
    """(answer lines, other visible lines) of one source cell."""
    lines = split_hidden(cell.source)[0].split("\n")
    if not any(SOLUTION_BEGIN in ln for ln in lines):
        solution = cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)
        return (lines, []) if solution else ([], lines)
    parts: tuple[list[str], list[str]] = ([], [])  # (other, answers)
    inside = False
    for line in lines:
        if SOLUTION_BEGIN in line or SOLUTION_END in line:
            inside = SOLUTION_BEGIN in line
        else:
            parts[inside].append(line)
    return parts[1], parts[0]


def solution_only_lines(source: NotebookNode, release: NotebookNode | None,
                        library: Path | None = LIBRARY) -> set[str]:
    """Answer lines of `source` that appear nowhere in `release` (cells and outputs), nor in
    `source` outside its answers and hidden tests, nor in the `library` the notebooks import
    (learners have its source; a check's hint or a displayed reference quotes it)."""
    answers, other = [], []
    for mine, rest in map(_answers, source.cells):
        answers += mine
        other += rest
    if release is not None:
        other += [c.source for c in release.cells] + _output_text(release)
    elsewhere = _flat(other) + "\n" + (library_text(library) if library else "")
    return {norm for ln in answers
            if len(norm := normalise(ln)) >= MIN_CHARS and norm not in elsewhere}


def library_text(folder: Path = LIBRARY) -> str:
    """The Python source under `folder`, as one text (`_flat`), read again when it changes."""
    return _library_text(tuple((p, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*.py"))))


@lru_cache(maxsize=4)
def _library_text(stamp: tuple[tuple[Path, int], ...]) -> str:
    return _flat([path.read_text(errors="replace") for path, _ in stamp])


def own_text(graded: NotebookNode, handed_in: Path | None = None) -> str:
    """What the student handed in, as one text with whitespace collapsed: the autograded
    notebook's cell sources (hidden regions left out) and, when given, the text of every file
    of their submitted folder `handed_in` (a notebook nbgrader could not read is only there),
    raw and with JSON's string escapes undone."""
    texts = [split_hidden(c.source)[0] for c in graded.cells]
    for path in sorted(handed_in.rglob("*")) if handed_in and handed_in.is_dir() else []:
        if path.is_file() and path.stat().st_size <= OWN_FILE_BYTES:
            raw = path.read_text(errors="replace")
            texts += [raw, _JSON_ESCAPE.sub(lambda m: _UNESCAPE.get(m[1], m[1]), raw)]
    return _flat(texts)


def _flat(texts: list[str]) -> str:
    """Texts as one, whitespace collapsed (a line wrapped differently, as in a markdown
    paragraph or a call split over lines, still reads as the page shows it), and again with
    inline-code backticks dropped, as a page shows them."""
    text = normalise(" ".join(texts))
    return text + "\n" + text.replace("`", "") if "`" in text else text


def secret_lines(graded: NotebookNode, source: NotebookNode,
                 release: NotebookNode | None = None,
                 handed_in: Path | None = None) -> dict[str, str]:
    """{line: kind} of what must not be read in this student's feedback (the module doc's
    rule): every distinctive hidden-test line, and every solution-only line that is not in
    what the student handed in (`own_text`)."""
    found = dict.fromkeys(distinctive_hidden_lines(graded), "hidden-test")
    own = own_text(graded, handed_in)
    for line in solution_only_lines(source, release):
        if line not in own:
            found.setdefault(line, "solution")
    return found


def file_text(name: str, content: str) -> str:
    """The text a file shows, searched for secret lines: for HTML its readable text and its
    whole markup (entities resolved), whitespace collapsed."""
    if Path(name).suffix.lower() in (".html", ".htm"):
        return html_text(content) + "\n" + normalise(html_lib.unescape(content))
    return normalise(content)


def find_secrets(text: str, secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(kind, line) of each secret line in `text` (from `file_text`), hidden tests first."""
    return sorted((kind, line) for line, kind in secrets.items() if line in text)


def _read(path: Path) -> NotebookNode | None:
    return nbformat.read(str(path), as_version=4) if path.is_file() else None


def _check_file(path: Path, secrets: dict[str, str] | None, student: str,
                module: str) -> Withheld | None:
    """Withhold (delete) `path` if it shows a secret (None: sources unknown, always)."""
    if secrets is None:
        found = [("unchecked", NO_SOURCE)]
    else:
        try:
            content = path.read_text(errors="replace")
        except OSError:
            return None
        found = find_secrets(file_text(path.name, content), secrets)
    if not found:
        return None
    path.unlink()
    return Withheld(student, module, str(path), *found[0])


def scan_feedback(root: Path, module: str = "*") -> list[Withheld]:
    """Check every file of root/feedback/<student>/<module>/ against that student's secrets
    (from autograded/, solutions/ and course/ under `root`); delete each file that shows one."""
    withheld = []
    for folder in sorted((Path(root) / "feedback").glob(f"*/{module}")):
        if not folder.is_dir():
            continue
        student, mod = folder.parent.name, folder.name
        graded_dir = Path(root) / "autograded" / student / mod
        secrets: dict[str, str] | None = {}
        names = (sorted(p.stem for p in graded_dir.glob("*.ipynb"))
                 or sorted(p.stem for p in folder.glob("*.html")))
        for name in names:
            source = _read(Path(root) / "solutions" / mod / f"{name}.ipynb")
            if source is None or secrets is None:
                secrets = None
                continue
            release = _read(Path(root) / "course" / mod / f"{name}.ipynb")
            graded = _read(graded_dir / f"{name}.ipynb")
            if graded is None:  # nothing autograded to compare with: the source's hidden tests
                secrets.update(dict.fromkeys(distinctive_hidden_lines(source), "hidden-test"))
                graded = nbformat.v4.new_notebook()
            secrets.update(secret_lines(graded, source, release,
                                        Path(root) / "submitted" / student / mod))
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            if (found := _check_file(path, secrets, student, mod)) is not None:
                withheld.append(found)
    return withheld


def withheld_in_log(log: str) -> list[Withheld]:
    """The WITHHELD lines of an nbgrader log (FeedbackGuard's), once each."""
    found: dict[tuple[str, str, str], Withheld] = {}
    for m in _WITHHELD.finditer(log):
        w = Withheld(m["student"], m["module"], m["path"], m["kind"],
                     ast.literal_eval(m["line"]))
        found.setdefault((w.student, w.module, w.path), w)
    return list(found.values())


def failed_in_log(log: str) -> set[tuple[str, str]]:
    """(student, module) of each submission nbgrader reports it could not process."""
    return {(m["student"], m["module"]) for m in _FAILED.finditer(log)}


class FeedbackGuard(HTMLExporter):
    """nbgrader's HTML exporter, refusing any page (or copied file) that shows a secret line
    of its student's notebook (the module doc); set as c.GenerateFeedback.exporter_class."""

    coursedir = Instance(CourseDirectory, allow_none=True,
                         help="Where solutions/ and course/ are (default: the converter's)")

    @default("coursedir")
    def _coursedir_default(self) -> CourseDirectory | None:
        return getattr(self.parent, "coursedir", None)

    def from_notebook_node(  # type: ignore[override]  # as HTMLExporter's own
            self, nb: NotebookNode, resources: dict[str, Any] | None = None,
            **kw: Any) -> tuple[str, dict[str, Any]]:
        info = (resources or {}).get("nbgrader", {})
        student, module = info.get("student", "?"), info.get("assignment", "?")
        name = info.get("notebook") or (resources or {}).get("metadata", {}).get("name", "?")
        secrets = self._secrets(nb, student, module, name)  # before the preprocessors
        output, resources = super().from_notebook_node(nb, resources, **kw)
        dest = (None if self.coursedir is None else Path(self.coursedir.format_path(
            self.coursedir.feedback_directory, student, module)))
        page = str(dest / f"{name}.html") if dest else f"{student}/{module}/{name}.html"
        graded_dir = Path((resources or {}).get("metadata", {}).get("path") or ".")
        pages = {f"{p.stem}.html" for p in graded_dir.glob("*.ipynb")} | {f"{name}.html"}
        withheld = []
        if dest is not None and dest.is_dir():  # files nbgrader copied beside the notebooks
            for path in sorted(p for p in dest.rglob("*") if p.is_file()):
                if path.relative_to(dest).as_posix() not in pages and (
                        w := _check_file(path, secrets, student, module)):
                    withheld.append(w)
        found = ([("unchecked", NO_SOURCE)] if secrets is None
                 else find_secrets(file_text(page, output), secrets))
        if found:
            withheld.append(Withheld(student, module, page, *found[0]))
        if withheld:
            for w in withheld:
                self.log.error(w.message())
            raise FeedbackWithheld("\n".join(w.message() for w in withheld))
        return output, resources

    def _secrets(self, nb: NotebookNode, student: str, module: str,
                 name: str) -> dict[str, str] | None:
        if (cd := self.coursedir) is None:
            return None

        def notebook(step: str) -> NotebookNode | None:
            return _read(Path(cd.format_path(step, ".", module)) / f"{name}.ipynb")

        source = notebook(cd.source_directory)
        if source is None:
            return None
        handed_in = Path(cd.format_path(cd.submitted_directory, student, module))
        return secret_lines(nb, source, notebook(cd.release_directory), handed_in)

