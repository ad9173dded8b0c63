"""Autograding throughput: a class of module 02 submissions graded with the instructor commands.

    .venv/bin/python benchmarks/bench_class.py [--students 200] [--workers 2] [--sandboxed-only]
        [-- NBGRADER_ARGS]

In a temporary course root: module 02 released with the gradebook on, and a few distinct
notebooks (`VARIANTS`): the fully answered one (`fake_submission` from solutions/), the blank
release, and three broken ones, each the answered notebook with one answer cell followed by a
wrong answer from autograder/mistakes/02_tensor_parallel/ (it redefines the names that cell
defines, as a learner's edit would). Each variant is first graded alone, in an nbgrader
process of its own (`python -m parlab.grading autograde --workers N --student alone-<variant>
...`, one worker per variant), with the plain executor (`PLAIN`: fresh kernels, every cell
run, the notebook's own verdicts without the verifier); then the class, `--students` copies
dealt round-robin over the variants, is graded by ONE call of `python -m parlab.grading
autograde --workers W` (what `make autograde WORKERS=W` runs) with the course's own
configuration, plus `--ResilientExecute.profile=True` so that each notebook records where its
time went (parlab.grading.autograde.profile).

Printed: submissions per minute; wall and CPU seconds per phase summed over the class (kernel
start, imports, answers, tests, demos, replays, kernel shutdown, and "nbgrader" for the rest of
each worker's time: its start-up, sanitising, saving the gradebook); the peak RSS of the
largest process of the class run; and the check: every student's score in every test cell
equals that of its variant graded alone. Then (unless --sandboxed-only) the class is graded
again without the sandbox (`--unsafe`, what `make autograde UNSAFE=1` runs), and a table shows
the two side by side (parlab.grading.sandbox: what the sandbox costs). Exit status 1 if a
score differs.
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from parlab.grading import (
    AUTOGRADER_DIR,
    SOLUTIONS_DIR,
    GradeRun,
    fake_submission,
    generate_release,
    is_answer_cell,
)
from parlab.grading.autograde.profile import PHASES

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "bench"
MODULE = "02_tensor_parallel"
MISTAKES_DIR = AUTOGRADER_DIR / "mistakes" / MODULE
# Broken variants: a middle exercise (partial marks), an early one (every later check builds on
# it: no marks), a late one.
MISTAKES = ("wrong_shard", "missing_backward_allreduce", "extra_g")  # the first: partial marks
VARIANTS = ("answered", "blank", *MISTAKES)
# The reference executor: a fresh kernel per notebook, every cell run, hidden tests included,
# the notebook's own verdicts (no verifier): the class's verified scores must equal them.
PLAIN = ("--ResilientExecute.skip_after_last_test=False", "--ResilientExecute.verify=False")
PROFILE = ("--ResilientExecute.profile=True",)
REPO = Path(__file__).resolve().parents[1]


def _defined_names(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def broken(answered: nbformat.NotebookNode, mistake: str) -> nbformat.NotebookNode:
    """`answered` with the mistake file's code after the answer cell defining its names."""
    source = (MISTAKES_DIR / f"{mistake}.py").read_text()
    names = _defined_names(source)
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(answered), as_version=4))
    cell = next(c for c in nb.cells if is_answer_cell(c) and names & _defined_names(c.source))
    cell.source += "\n\n# a learner's wrong version\n" + source
    return nb


def prepare(root: Path, students: int) -> dict[str, str]:
    """Release module 02 into `root`, submit each variant as alone-<variant> and the class as
    s000, s001, ...; {student: variant}."""
    shutil.copytree(SOLUTIONS_DIR / MODULE, root / "solutions" / MODULE,
                    ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"))
    generate_release(MODULE, root=root, database=True)
    name = f"{MODULE}.ipynb"
    blank = nbformat.read(str(root / "course" / MODULE / name), as_version=4)
    answered = fake_submission(root / "solutions" / MODULE / name, blank)
    notebooks = {"answered": answered, "blank": blank,
                 **{m: broken(answered, m) for m in MISTAKES}}
    who = {f"alone-{v}": v for v in VARIANTS}
    who.update({f"s{i:03d}": VARIANTS[i % len(VARIANTS)] for i in range(students)})
    for student, variant in who.items():
        folder = root / "submitted" / student / MODULE
        folder.mkdir(parents=True)
        nbformat.write(notebooks[variant], str(folder / name))
    return who


def instructor(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m parlab.grading --root ROOT ARGS`, what the make targets call."""
    return subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=3600)


def grade_alone(root: Path, students: list[str]) -> dict[str, dict]:
    """Each student graded alone, with the plain executor: {student: {grade_id: score}}.

    One instructor command with a worker per student: each worker is an nbgrader process of
    its own that grades that one notebook."""
    proc = instructor(root, "autograde", "--module", MODULE, "--workers", str(len(students)),
                      *[a for s in students for a in ("--student", s)], "--all", "--", *PLAIN)
    run = GradeRun.load(root)
    cells = {r.student: {gid: score for gid, (score, _) in r.cells.items()}
             for r in run.results}
    if set(cells) != set(students) or any(r.score is None for r in run.results):
        raise RuntimeError(f"grading {students} alone failed:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return cells


@dataclass
class ClassRun:
    students: int
    workers: int
    seconds: float
    peak_rss: int
    phases: dict[str, list[float]] = field(default_factory=dict)  # phase -> [wall s, CPU s]
    wrong: list[str] = field(default_factory=list)  # students whose scores differ
    reference: dict[str, dict] = field(default_factory=dict)  # alone-<variant> -> cells

    @property
    def per_minute(self) -> float:
        return 60 * self.students / self.seconds


def _profiles(root: Path, students: list[str]) -> tuple[dict[str, list[float]], float]:
    """Phases summed over the students' autograded notebooks, and their summed seconds."""
    total: dict[str, list[float]] = {p: [0.0, 0.0] for p in PHASES}
    seconds = 0.0
    for student in students:
        path = root / "autograded" / student / MODULE / f"{MODULE}.ipynb"
        meta = nbformat.read(str(path), as_version=4).metadata.get("parlab", {}).get(
            "grading", {})
        seconds += meta.get("seconds", 0.0)
        for phase, (wall, cpu) in meta.get("profile", {}).items():
            spent = total.setdefault(phase, [0.0, 0.0])
            spent[0] += wall
            spent[1] += cpu
    return total, seconds


def grade_class(root: Path, who: dict[str, str], workers: int,
                extra: tuple[str, ...] = (), *, unsafe: bool = False,
                reference: dict[str, dict] | None = None) -> ClassRun:
    """The class (every student not named alone-*) graded by one instructor command; with
    `unsafe`, without the sandbox (`make autograde UNSAFE=1`). `reference`: the variants'
    scores graded alone, if already known."""
    students = sorted(s for s in who if not s.startswith("alone-"))
    if reference is None:
        reference = grade_alone(root, sorted({f"alone-{who[s]}" for s in students}))
    start = time.perf_counter()
    proc = instructor(root, "autograde", "--module", MODULE, "--workers", str(workers), "--all",
                      *[a for s in students for a in ("--student", s)],
                      *(["--unsafe"] if unsafe else []), "--", *PROFILE, *extra)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    run = GradeRun.load(root)
    graded = {r.student: {gid: score for gid, (score, _) in r.cells.items()}
              for r in run.results}
    if set(graded) != set(students):
        raise RuntimeError(f"the class run graded {len(graded)} of {len(students)}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    wrong = [s for s in students if graded[s] != reference[f"alone-{who[s]}"]]
    phases, in_notebooks = _profiles(root, students)
    phases["nbgrader"] = [max(0.0, seconds * min(workers, len(students)) - in_notebooks), 0.0]
    return ClassRun(len(students), workers, seconds, peak, phases, wrong, reference)


def side_by_side(sandboxed: ClassRun, unsafe: ClassRun) -> str:
    """The class graded in sandboxes and without them, one table."""
    rows = [("seconds", f"{sandboxed.seconds:.0f}", f"{unsafe.seconds:.0f}"),
            ("submissions per minute", f"{sandboxed.per_minute:.1f}",
             f"{unsafe.per_minute:.1f}"),
            ("kernel start, CPU s summed", f"{sandboxed.phases['kernel start'][1]:.0f}",
             f"{unsafe.phases['kernel start'][1]:.0f}"),
            ("kernel shutdown, wall s summed", f"{sandboxed.phases['shutdown'][0]:.0f}",
             f"{unsafe.phases['shutdown'][0]:.0f}"),
            ("scores as graded alone", "yes" if not sandboxed.wrong else "NO",
             "yes" if not unsafe.wrong else "NO")]
    return "\n".join([f"| {sandboxed.students} submissions, {sandboxed.workers} workers | "
                      "sandboxed (the default) | without the sandbox (UNSAFE=1) |",
                      "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows),
                      "", f"sandbox / no sandbox, wall time: "
                      f"{sandboxed.seconds / unsafe.seconds:.2f}"])


def report(result: ClassRun) -> str:
    lines = [f"{result.students} submissions of {MODULE} graded by {result.workers} workers "
             f"in {result.seconds:.0f} s: {result.per_minute:.1f} submissions per minute; "
             f"peak RSS of the largest process {result.peak_rss / 2**20:.0f} MiB; "
             f"load average {os.getloadavg()[0]:.1f} at the end",
             "", "| phase | wall s (summed over the class) | CPU s |", "|---|---|---|"]
    for phase, (wall, cpu) in result.phases.items():
        if wall or cpu:
            lines.append(f"| {phase} | {wall:.0f} | {cpu:.0f} |")
    verdict = ("every student's score in every test cell equals its notebook's graded alone "
               "with the plain executor" if not result.wrong else
               f"SCORES DIFFER from grading alone for {len(result.wrong)} students: "
               f"{result.wrong[:10]}")
    return "\n".join([*lines, "", verdict])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the course root")
    parser.add_argument("--sandboxed-only", action="store_true",
                        help="skip the second run without the sandbox (half the time)")
    parser.add_argument("nbgrader_args", nargs="*", help="extra options for the class run")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="parlab-bench-class-"))
    try:
        who = prepare(root, args.students)
        result = grade_class(root, who, args.workers, tuple(args.nbgrader_args))
        unsafe = None if args.sandboxed_only else grade_class(
            root, who, args.workers, tuple(args.nbgrader_args), unsafe=True,
            reference=result.reference)
        text = report(result) + ("" if unsafe is None else "\n\n" + side_by_side(result, unsafe))
        print(text)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "class.md").write_text(text + "\n")
    finally:
        if args.keep:
            print(f"course root kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if result.wrong or (unsafe is not None and unsafe.wrong) else 0


if __name__ == "__main__":
    sys.exit(main())
