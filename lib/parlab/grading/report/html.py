"""The class report: what the class got right and wrong, per module, on one HTML page.

`make report` (python -m parlab.grading report) reads the grading record (every submission's
latest result, parlab.grading.engines.record) and the gradebook's points per test, and writes
report.html: per module, a histogram of the scores, each test's pass rate (full points) and
its most common error, and how often each "Likely mistake" diagnosis of parlab.check
appeared, by test. It prints the same summary. Plots are matplotlib PNGs inside the page; no
server is needed to read it.
"""

from __future__ import annotations

import base64
import html
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from parlab.grading.engines.record import class_results
from parlab.grading.engines.results import Graded


@dataclass
class ModuleReport:
    """One module's numbers: scores, and per test the passes, errors and diagnoses."""

    module: str
    max_score: float
    scores: list[float] = field(default_factory=list)
    not_graded: int = 0
    points: dict[str, float] = field(default_factory=dict)  # test -> its points
    passed: Counter = field(default_factory=Counter)  # test -> submissions with full points
    errors: dict[str, Counter] = field(default_factory=dict)  # test -> Counter of enames
    diagnoses: Counter = field(default_factory=Counter)  # (test, diagnosis) -> count
    # (student, test, what): where the notebook's check and the verifier's disagreed
    disagreements: list[tuple[str, str, str]] = field(default_factory=list)

    def pass_rate(self, test: str) -> float:
        return self.passed[test] / len(self.scores) if self.scores else 0.0


def _points(root: Path, module: str) -> dict[str, float]:
    with Gradebook(f"sqlite:///{Path(root) / 'gradebook.db'}") as gb:
        try:
            return {c.name: float(c.max_score) for nb in gb.find_assignment(module).notebooks
                    for c in nb.grade_cells}
        except MissingEntry:
            return {}


def build(root: Path, results: list[Graded] | None = None) -> list[ModuleReport]:
    """A ModuleReport per module in the record (or in `results`)."""
    reports: dict[str, ModuleReport] = {}
    for r in class_results(root) if results is None else results:
        rep = reports.get(r.module)
        if rep is None:
            rep = reports[r.module] = ModuleReport(r.module, r.max_score,
                                                   points=_points(root, r.module))
        if r.score is None:
            rep.not_graded += 1
            continue
        rep.scores.append(r.score)
        for test, (score, message) in r.cells.items():
            if score is not None and score >= rep.points.get(test, float("inf")):
                rep.passed[test] += 1
            elif message:
                rep.errors.setdefault(test, Counter())[message.split(":")[0]] += 1
        for test, diagnosis in r.diagnoses.items():
            rep.diagnoses[(test, diagnosis)] += 1
        rep.disagreements += [(r.student, t, w) for t, w in sorted(r.disagreements.items())]
    return [reports[m] for m in sorted(reports)]


def summary(reports: list[ModuleReport]) -> str:
    """The printed summary: per module, scores, the hardest tests, the commonest mistakes."""
    lines = []
    for rep in reports:
        mean = sum(rep.scores) / len(rep.scores) if rep.scores else 0.0
        lines.append(f"{rep.module}: {len(rep.scores)} graded ({rep.not_graded} not), mean "
                     f"{mean:.1f} of {rep.max_score:g}")
        for test in sorted(rep.points, key=rep.pass_rate):
            common = rep.errors.get(test, Counter()).most_common(1)
            why = f"; most often {common[0][0]} ({common[0][1]}x)" if common else ""
            lines.append(f"  {test:<28} {100 * rep.pass_rate(test):5.0f}% pass{why}")
        for (test, diagnosis), n in rep.diagnoses.most_common(5):
            lines.append(f"  likely mistake, {n}x in {test}: {diagnosis}")
        for student, test, what in rep.disagreements:
            lines.append(f"  DISAGREE {student}, {test}: {what}")
    return "\n".join(lines) or "nothing graded yet: run make autograde first"


def _histogram(rep: ModuleReport) -> str:
    from matplotlib.figure import Figure  # here: the grader's other commands never draw

    fig = Figure(figsize=(5, 2.6), dpi=90)  # no pyplot: no GUI backend, no global state
    ax = fig.subplots()
    top = max(rep.max_score, max(rep.scores, default=0.0))
    bins = [x - 0.5 for x in range(int(top) + 2)] if top <= 30 else 20
    ax.hist(rep.scores, bins=bins, color="#4472c4", edgecolor="white")
    ax.set_xlabel(f"score (of {rep.max_score:g})")
    ax.set_ylabel("submissions")
    ax.set_title(rep.module)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def _module_html(rep: ModuleReport) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(t)}</td><td>{rep.points[t]:g}</td><td>{100 * rep.pass_rate(t):.0f}%</td>"
        f"<td>{e(', '.join(f'{k} ({n})' for k, n in rep.errors.get(t, Counter()).most_common(3)))}"
        "</td></tr>" for t in rep.points)
    mistakes = "".join(f"<tr><td>{n}</td><td>{e(t)}</td><td>{e(d)}</td></tr>"
                       for (t, d), n in rep.diagnoses.most_common()) or (
        "<tr><td colspan=3>no check gave a diagnosis</td></tr>")
    disagree = "".join(f"<tr><td>{e(s)}</td><td>{e(t)}</td><td>{e(w)}</td></tr>"
                       for s, t, w in rep.disagreements) or (
        "<tr><td colspan=3>none: every notebook's checks agreed with the verifier</td></tr>")
    return (f"<h2>{e(rep.module)}</h2><p>{len(rep.scores)} graded, {rep.not_graded} not "
            f"graded</p><img alt='score histogram of {e(rep.module)}' "
            f"src='data:image/png;base64,{_histogram(rep)}'>"
            "<h3>Tests</h3><table><tr><th>test</th><th>points</th><th>pass rate</th>"
            f"<th>errors of the others</th></tr>{rows}</table>"
            "<h3>Likely mistakes</h3><table><tr><th>times</th><th>test</th><th>diagnosis</th>"
            f"</tr>{mistakes}</table>"
            "<h3>Notebook and verifier disagree</h3><table><tr><th>student</th><th>test</th>"
            f"<th>what</th></tr>{disagree}</table>")


def write_report(root: Path, to: Path) -> list[ModuleReport]:
    """Write the class report to `to` (HTML); the ModuleReports it shows."""
    reports = build(root)
    body = "".join(_module_html(r) for r in reports) or "<p>Nothing graded yet.</p>"
    Path(to).write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title><style>"
        "body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>Class report</h1>{body}</body></html>", encoding="utf-8")
    return reports
