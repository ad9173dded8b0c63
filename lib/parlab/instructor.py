"""The instructor's command line: collect, autograde (in parallel), export, feedback.

    python -m parlab.instructor collect FROM             # FROM/<student>/<module>/... or
                                                         # FROM/<student>/<module>.ipynb
    python -m parlab.instructor autograde [--module M] [--workers 3]
    python -m parlab.instructor export [--to grades.csv]
    python -m parlab.instructor feedback [--module M]
    python -m parlab.instructor fake INBOX               # three fake students, to try it all

The Makefile's `collect`, `autograde`, `export` and `feedback` targets call these (see
autograder/README.md). `--root DIR` grades another course root (default: this repository;
tests use a temporary one). Every nbgrader call runs through `parlab.grading.run_nbgrader`,
from autograder/ with the venv's bin/ first on PATH.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import shutil
import sys
from pathlib import Path

import nbformat

from parlab.feedback import distinctive_hidden_lines, leaks
from parlab.grading import REPO_ROOT, fake_submission, is_answer_cell, list_modules, run_nbgrader
from parlab.parallel_autograde import GradeRun, autograde_parallel, unreadable_reason

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # what nbgrader reads from timestamp.txt


def collect(source: Path, root: Path = REPO_ROOT) -> list[tuple[str, str, str]]:
    """Copy submissions from `source` into root/submitted/<student>/<module>/.

    Accepted layouts: <student>/<module>/<files> (nbgrader's own) and <student>/<module>.ipynb
    (one released notebook per file). A submission replaces an earlier one of the same student
    and module. timestamp.txt (for late penalties) is kept, or written from the file's mtime.
    Returns (student, module, note) for everything collected.
    """
    source, root = Path(source).resolve(), Path(root).resolve()
    modules = set(list_modules(root / "solutions"))
    if not source.is_dir():
        raise SystemExit(f"collect: {source} is not a folder")
    found: list[tuple[str, str, Path]] = []  # (student, module, folder or notebook)
    for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
        if student_dir.name.startswith((".", "_")):
            continue
        for entry in sorted(student_dir.iterdir()):
            name = entry.name if entry.is_dir() else entry.stem
            if name in modules and (entry.is_dir() or entry.suffix == ".ipynb"):
                found.append((student_dir.name, name, entry))
    collected = []
    for student, module, entry in found:
        dest = root / "submitted" / student / module
        note = "replaced an earlier submission" if dest.exists() else "new"
        if dest.exists():
            shutil.rmtree(dest)
        if entry.is_dir():
            shutil.copytree(entry, dest, ignore=shutil.ignore_patterns(
                ".ipynb_checkpoints", "__pycache__", ".*"))
        else:
            dest.mkdir(parents=True)
            shutil.copy2(entry, dest / f"{module}.ipynb")
        notebook = dest / f"{module}.ipynb"
        if not notebook.exists():
            note += f"; no {module}.ipynb: its tests will score 0"
        elif why := unreadable_reason(notebook):
            note += f"; unreadable notebook ({why}): it will be graded 0 with that message"
        if not (dest / "timestamp.txt").exists() and notebook.exists():
            when = dt.datetime.fromtimestamp(notebook.stat().st_mtime, dt.timezone.utc)
            (dest / "timestamp.txt").write_text(when.strftime(TIMESTAMP_FORMAT))
        collected.append((student, module, note))
    return collected


def fake_class(inbox: Path, root: Path = REPO_ROOT) -> list[str]:
    """Three fake students' work for every released module, to try the workflow on:
    alice answers everything (from solutions/), bob hands in the blank release, carol answers
    all but the first exercise. Written as inbox/<student>/<module>.ipynb."""
    made = []
    for module in list_modules(root / "course"):
        name = f"{module}.ipynb"
        release = nbformat.read(str(root / "course" / module / name), as_version=4)
        full = fake_submission(root / "solutions" / module / name, release)
        carol = copy.deepcopy(full)
        first = next(i for i, c in enumerate(release.cells) if is_answer_cell(c))
        carol.cells[first] = copy.deepcopy(release.cells[first])
        for student, nb in (("alice", full), ("bob", release), ("carol", carol)):
            (inbox / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(inbox / student / name))
            made.append(f"{student}/{name}")
    return made


def print_run(run: GradeRun) -> None:
    print(f"{'student':<20} {'module':<24} {'score':>11}  {'s':>6} {'restarts':>8}  status")
    for r in sorted(run.results, key=lambda r: (r.module, r.student)):
        score = "-" if r.score is None else f"{r.score:g}/{r.max_score:g}"
        secs = "-" if r.seconds is None else f"{r.seconds:.0f}"
        print(f"{r.student:<20} {r.module:<24} {score:>11}  {secs:>6} {r.restarts:>8}  {r.status}")
        for gid, (score_, message) in r.cells.items():
            if message:
                print(f"{'':<22}{gid}: {score_:g} pts, {message[:110]}")
    print(f"{len(run.results)} submissions graded by {run.workers} workers in "
          f"{run.seconds:.0f} s; processes left behind (killed): {len(run.leftover)}")


def feedback(root: Path = REPO_ROOT, module: str = "*") -> list[tuple[Path, list[str]]]:
    """nbgrader generate_feedback, then withhold any file in which a hidden test can be read.

    Returns (html file, leaked lines) for every file withheld (deleted); [] when none leaks.
    """
    root = Path(root).resolve()
    run_nbgrader("generate_feedback", module, "--force", root=root)
    withheld = []
    for html in sorted((root / "feedback").glob(f"*/{module}/*.html")):
        student, mod = html.parent.parent.name, html.parent.name
        graded = root / "autograded" / student / mod / f"{html.stem}.ipynb"
        if not graded.exists():
            continue
        found = leaks(html.read_text(), distinctive_hidden_lines(
            nbformat.read(str(graded), as_version=4)))
        if found:
            html.unlink()
            withheld.append((html, found))
    return withheld


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.instructor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="course root")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fake", help="write three fake students' work into a folder")
    p.add_argument("inbox", type=Path)
    p = sub.add_parser("collect", help="copy submissions into submitted/")
    p.add_argument("source", help="folder of submissions (make collect FROM=<folder>)")
    p = sub.add_parser("autograde", help="autograde submitted/ with parallel workers")
    p.add_argument("--module", default="*")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--student", action="append", help="only these students (repeatable)")
    p.add_argument("nbgrader_args", nargs="*", help="extra nbgrader options, after --")
    p = sub.add_parser("export", help="grades as CSV")
    p.add_argument("--to", type=Path, default=None, help="CSV file (default: ROOT/grades.csv)")
    p = sub.add_parser("feedback", help="feedback HTML without hidden tests")
    p.add_argument("--module", default="*")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    if args.command == "fake":
        made = fake_class(args.inbox.resolve(), root)
        print(f"wrote {len(made)} notebooks into {args.inbox}: {', '.join(made)}")
        return 0
    if args.command == "collect":
        if not args.source.strip():
            parser.error("collect needs a folder of submissions: make collect FROM=<folder>")
        rows = collect(Path(args.source), root)
        for student, module, note in rows:
            print(f"{student:<20} {module:<24} {note}")
        print(f"collected {len(rows)} submissions into {root / 'submitted'}")
        return 0 if rows else 1
    if args.command == "autograde":
        if args.workers < 1:
            parser.error("--workers must be at least 1")
        run = autograde_parallel(root, args.module, workers=args.workers,
                                 students=args.student, nbgrader_args=tuple(args.nbgrader_args))
        print_run(run)
        return 0 if all(r.score is not None for r in run.results) and not run.leftover else 1
    if args.command == "export":
        to = (args.to or root / "grades.csv").resolve()
        run_nbgrader("export", f"--to={to}", root=root)
        print(f"grades written to {to}")
        return 0
    withheld = feedback(root, args.module)
    for html, lines in withheld:
        print(f"WITHHELD {html}: hidden test lines visible: {lines[:3]}", file=sys.stderr)
    print(f"feedback in {root / 'feedback'}; {len(withheld)} file(s) withheld")
    return 1 if withheld else 0


if __name__ == "__main__":
    sys.exit(main())
