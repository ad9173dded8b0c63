"""The command line of the grading package: `python -m parlab.grading <command>`.

    python -m parlab.grading collect FROM [--times CSV]   # FROM/<student>/<module>/... or
                                                          # FROM/<student>/<any>.ipynb
    python -m parlab.grading autograde [--module M] [--workers 3] [--student S] [--all]
                                       [-- NBGRADER_ARGS]
    python -m parlab.grading export [--to grades.csv]
    python -m parlab.grading feedback [--module M]
    python -m parlab.grading report [--to report.html]  # the class report
    python -m parlab.grading check [MODULE]       # a learner's self-check (make check)
    python -m parlab.grading fake INBOX           # three fake students, to try it all
    python -m parlab.grading stale                # which workspace notebooks are out of date
    python -m parlab.grading update MODULE        # carry your answers into a new release

The Makefile's `collect`, `autograde`, `export`, `feedback` and `check` targets call these
(see autograder/README.md). `--root DIR` grades another course root (default: this
repository; tests use a temporary one). Every nbgrader call runs through
`parlab.grading.run_nbgrader`, from autograder/ with the venv's bin/ first on PATH.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from parlab.grading.base.paths import REPO_ROOT
from parlab.grading.collect.fake import fake_class
from parlab.grading.collect.inbox import collect
from parlab.grading.collect.times import TimesError
from parlab.grading.engines.grade import SandboxMissing, autograde_parallel
from parlab.grading.engines.record import graded_unsafe
from parlab.grading.engines.results import GradeRun, log_warnings
from parlab.grading.feedback.withhold import write_feedback
from parlab.grading.learner import selfcheck, workspace
from parlab.grading.report.export import export_grades
from parlab.grading.report.html import summary, write_report


def print_run(run: GradeRun) -> None:
    """One line per submission (score, seconds, restarts, status), then each failed test."""
    print(f"{'student':<20} {'module':<24} {'score':>11}  {'s':>6} {'restarts':>8}  status")
    for r in sorted(run.results, key=lambda r: (r.module, r.student)):
        score = "-" if r.score is None else f"{r.score:g}/{r.max_score:g}"
        secs = "-" if r.seconds is None else f"{r.seconds:.0f}"
        print(f"{r.student:<20} {r.module:<24} {score:>11}  {secs:>6} {r.restarts:>8}  {r.status}")
        for gid, (score_, message) in r.cells.items():
            if message:
                pts = "-" if score_ is None else f"{score_:g}"
                print(f"{'':<22}{gid}: {pts} pts, {message[:110]}")
        for gid, what in r.disagreements.items():
            print(f"{'':<22}{gid}: DISAGREE: {what} (tampering, or a check that differs "
                  "between the two: see autograder/README.md, \"The verifier\")")
        for gid, why in r.unverified.items():
            print(f"{'':<22}{gid}: not verified ({why[:100]}); the notebook's score stands")
    warnings = log_warnings(run.logs)
    if warnings:
        print(f"nbgrader's warnings ({len(warnings)}; the logs are in autograded/.parlab/):")
        for line in warnings:
            print(f"  {line[:300]}")
    print(f"{len(run.results)} submissions graded by {run.workers} workers in "
          f"{run.seconds:.0f} s; {len(run.unchanged)} up to date, not graded again (ALL=1 "
          f"grades them again); processes left behind (killed): {len(run.leftover)}")
    if not run.sandbox:
        print("WARNING: graded WITHOUT the sandbox (UNSAFE=1): every submission's code ran "
              "with your rights; recorded in autograded/.parlab/record.json")


def _collect(args: argparse.Namespace, root: Path) -> int:
    try:
        report = collect(Path(args.source), root, args.times)
    except TimesError as exc:
        print(f"collect: {exc}", file=sys.stderr)
        return 2
    for student, module, note in report.collected:
        print(f"{student:<20} {module:<24} {note}")
    for path, why in report.skipped:
        print(f"SKIPPED {path}: {why}")
    for path, why in report.left_out:
        print(f"LEFT OUT {path}: {why}")
    for path, why in report.problems:
        print(f"NOT COLLECTED {path}: {why}")
    print(f"collected {len(report.collected)} submissions into {root / 'submitted'}; "
          f"{len(report.problems)} not collected, {len(report.skipped)} duplicates skipped, "
          f"{len(report.left_out)} other files left out")
    return 0 if report.ok and report.collected else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m parlab.grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="course root")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fake", help="write three fake students' work into a folder")
    p.add_argument("inbox", type=Path)
    p = sub.add_parser("collect", help="copy submissions into submitted/")
    p.add_argument("source", help="folder of submissions (make collect FROM=<folder>)")
    p.add_argument("--times", type=Path, default=None, help="CSV of submission times "
                   "(columns: student, [module], timestamp), e.g. a learning platform's export")
    p = sub.add_parser("autograde", help="autograde submitted/ with parallel workers")
    p.add_argument("--module", default="*")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--student", action="append", help="only these students (repeatable)")
    p.add_argument("--all", action="store_true", help="grade every selected submission "
                   "again, not only new and changed ones (make autograde ALL=1)")
    p.add_argument("--unsafe", action="store_true", help="grade without the sandbox, "
                   "trusting every submission (make autograde UNSAFE=1); recorded")
    p.add_argument("nbgrader_args", nargs="*", help="extra nbgrader options, after --")
    p = sub.add_parser("export", help="grades as CSV")
    p.add_argument("--to", type=Path, default=None, help="CSV file (default: ROOT/grades.csv)")
    p = sub.add_parser("feedback", help="feedback HTML without hidden tests")
    p.add_argument("--module", default="*")
    p = sub.add_parser("report", help="the class report: scores, pass rates, likely mistakes")
    p.add_argument("--to", type=Path, default=None, help="HTML file (default: ROOT/report.html)")
    p = sub.add_parser("check", help="a learner's self-check: the visible tests, as graded",
                       description=selfcheck.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    selfcheck.add_arguments(p)
    p = sub.add_parser("stale", help="workspace notebooks from an older release (make lab)")
    p.add_argument("--workspace", type=Path, default=None, help="default: ROOT/workspace")
    p = sub.add_parser("update", help="carry a workspace notebook's answers into the current "
                       "release, keeping the old file", description=workspace.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module", help="e.g. 02_tensor_parallel (make update MODULE=...)")
    p.add_argument("--workspace", type=Path, default=None, help="default: ROOT/workspace")
    return parser


def _workspace(args: argparse.Namespace, root: Path) -> int:
    """`stale` (print what is out of date, exit 0) and `update MODULE`."""
    folder, course = (args.workspace or root / "workspace").resolve(), root / "course"
    if args.command == "stale":
        old = workspace.stale(folder, course)
        if old:
            print(workspace.stale_message(old))
        return 0
    try:
        done = workspace.update(args.module, workspace=folder, course=course)
    except (ValueError, FileNotFoundError) as exc:
        print(f"update: {exc}", file=sys.stderr)
        return 2
    print(f"workspace/{done.module}: {len(done.carried)} answers carried into the current "
          f"release; your previous file is kept as {done.backup.name}")
    if done.added:
        print(f"  {done.added} cells you added yourself are at the end of the notebook")
    if done.dropped:
        print(f"  not in the new release (still in the backup): {', '.join(done.dropped)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "check":
        return selfcheck.check_command(args, parser)
    if args.command in ("stale", "update"):
        return _workspace(args, root)
    if args.command == "fake":
        made = fake_class(args.inbox.resolve(), root)
        print(f"wrote {len(made)} notebooks into {args.inbox}: {', '.join(made)}")
        return 0
    if args.command == "collect":
        if not args.source.strip():
            parser.error("collect needs a folder of submissions: make collect FROM=<folder>")
        return _collect(args, root)
    if args.command == "autograde":
        if args.workers < 1:
            parser.error("--workers must be at least 1")
        try:
            run = autograde_parallel(root, args.module, workers=args.workers,
                                     students=args.student, regrade_all=args.all,
                                     nbgrader_args=tuple(args.nbgrader_args), unsafe=args.unsafe)
        except SandboxMissing as exc:
            print(exc, file=sys.stderr)
            return 2
        print_run(run)
        return 0 if all(r.score is not None for r in run.results) and not run.leftover else 1
    if args.command == "report":
        to = (args.to or root / "report.html").resolve()
        print(summary(write_report(root, to)))
        print(f"class report written to {to}")
        return 0
    if args.command == "export":
        to = (args.to or root / "grades.csv").resolve()
        rows = export_grades(root, to)
        counts = Counter(str(r["status"]) for r in rows)
        print(f"grades written to {to}: {len(rows)} rows ("
              + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ")")
        unsafe = graded_unsafe(root)
        if unsafe:
            print(f"WARNING: {len(unsafe)} of these grades come from runs WITHOUT the sandbox "
                  "(make autograde UNSAFE=1): their code ran with your rights. "
                  + ", ".join(f"{k} ({when})" for k, when in unsafe[:20]))
        return 0
    withheld = write_feedback(root, args.module)  # a WITHHELD line for each, on stderr
    print(f"feedback in {root / 'feedback'}; {len(withheld)} file(s) withheld")
    return 1 if withheld else 0
