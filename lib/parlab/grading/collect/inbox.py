"""Collect: copy learners' submissions into submitted/<student>/<module>/, losing none silently.

Accepted layouts in FROM (mixing them is fine):

    FROM/<student>/<module>/<files>      nbgrader's own (a timestamp.txt there is kept)
    FROM/<student>/<any name>.ipynb      one notebook per file, any file name

A notebook's module is its file name when that is a module's, else the nbgrader grade ids of
its cells (parlab.grading.collect.match): `02_tensor_parallel (1).ipynb` and `Copy of ...` are
graded as what they are. What cannot be collected is reported with the reason: a notebook that
matches no module, one outside a student folder, a module folder without a notebook
(MISSING); `CollectReport.ok` is False then, and the command exits non-zero. When two files of
one student match the same module, the one named as the module (else the newest) is taken and
the other reported. Every other file handed in that is not copied is listed with the reason
(`left_out`): a symbolic link (never followed: it could point at any file of the grader's
machine, the answers included; one named as a notebook is a problem, as a missing notebook
is), a file that is not a notebook beside a student's notebooks (an nbgrader module folder
keeps its other files), editor and cache files. Student ids are the folder names, with
characters nbgrader cannot take in an id (spaces, commas, glob characters) replaced by `_`.
The submission time (timestamp.txt, for late penalties) comes from parlab.grading.collect.times.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from parlab.grading.base.notebooks import unreadable_reason
from parlab.grading.base.paths import REPO_ROOT
from parlab.grading.collect.match import match_module, released_ids
from parlab.grading.collect.times import load_times, submission_time, write_timestamp

_NOT_IN_ID = re.compile(r"[^\w.@+-]+")
_SKIP = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", ".*")
LINK = ("a symbolic link, not followed (it could point at any file of this machine): hand in "
        "the file itself")
NOT_A_NOTEBOOK = ("not a notebook: only notebooks are taken from a student's folder (an "
                  "nbgrader module folder, <student>/<module>/, keeps its other files)")
CACHE = "an editor or cache file (hidden, checkpoints, __pycache__): not needed to grade"


@dataclass(frozen=True)
class Found:
    """One notebook handed in: whose, for which module, and where it is."""

    student: str  # the id it is collected as
    folder_name: str  # the student's folder in FROM
    module: str
    notebook: Path
    folder: Path | None  # the nbgrader-layout folder it came in, else None
    how: str


@dataclass
class CollectReport:
    """What collect did: (student, module, note) per submission, and what it could not use."""

    collected: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, why): not collected
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why): duplicates
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, why): other files

    @property
    def ok(self) -> bool:
        return not self.problems


def student_id(folder_name: str) -> str:
    """The nbgrader student id for a student's folder name."""
    return _NOT_IN_ID.sub("_", folder_name.strip()).strip("_") or "student"


def _notebooks(folder: Path, report: CollectReport | None = None) -> list[Path]:
    """The notebooks in `folder`; with `report`, every other entry is listed as left out."""
    found = []
    for p in sorted(folder.iterdir()):
        why = (LINK if p.is_symlink() else CACHE if _SKIP(str(folder), [p.name])
               else "" if p.suffix == ".ipynb" and p.is_file() else NOT_A_NOTEBOOK)
        if not why:
            found.append(p)
        elif report is not None:
            report.left_out.append((str(p), why))
    return found


def _find(source: Path, ids: dict[str, set[str]], report: CollectReport) -> list[Found]:
    found = []
    for entry in sorted(source.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or entry.name.startswith((".", "_")):
            if entry.suffix == ".ipynb" and not entry.is_symlink():
                report.problems.append((str(entry), "not in a student folder: put it in "
                                        "FROM/<student>/ and collect again"))
            elif entry.suffix == ".ipynb":
                report.problems.append((str(entry), LINK))
            else:
                report.left_out.append((str(entry), LINK if entry.is_symlink() else CACHE if
                                        entry.name.startswith((".", "_")) else
                                        "not in a student folder"))
            continue
        found += _student(entry, ids, report)
    return found


def _student(student_dir: Path, ids: dict[str, set[str]], report: CollectReport) -> list[Found]:
    sid, name = student_id(student_dir.name), student_dir.name
    found = []
    for entry in sorted(student_dir.iterdir()):
        if entry.is_symlink():
            (report.problems if entry.suffix == ".ipynb" else report.left_out).append(
                (str(entry), LINK))
        elif entry.is_dir() and entry.name in ids:
            found += _in_module_folder(entry, sid, name, ids, report)
        elif entry.is_dir() and not _SKIP(str(student_dir), [entry.name]):
            found += _loose(_notebooks(entry, report), sid, name, ids, report)
        elif entry.suffix == ".ipynb" and not _SKIP(str(student_dir), [entry.name]):
            found += _loose([entry], sid, name, ids, report)
        else:
            report.left_out.append((str(entry), CACHE if _SKIP(str(student_dir), [entry.name])
                                    else NOT_A_NOTEBOOK))
    return found


def _loose(paths: list[Path], sid: str, name: str, ids: dict[str, set[str]],
           report: CollectReport) -> list[Found]:
    found = []
    for path in paths:
        match = match_module(path, ids)
        if match.module is None:
            report.problems.append((str(path), f"matches no module: {match.how}"))
        else:
            found.append(Found(sid, name, match.module, path, None, match.how))
    return found


def _in_module_folder(folder: Path, sid: str, name: str, ids: dict[str, set[str]],
                      report: CollectReport) -> list[Found]:
    module = folder.name
    exact = folder / f"{module}.ipynb"
    _left_out_in(folder, report)
    if exact.is_file() and not exact.is_symlink():
        return [Found(sid, name, module, exact, folder, "by name")]
    for path in _notebooks(folder):
        match = match_module(path, ids)
        if match.module == module:
            return [Found(sid, name, module, path, folder, match.how)]
    others = ", ".join(p.name for p in _notebooks(folder)) or "no notebook at all"
    report.problems.append((str(folder), f"MISSING: no {module}.ipynb in this module folder "
                            f"({others}); ask the learner to hand it in"))
    return []


def _left_out_in(folder: Path, report: CollectReport) -> None:
    """What copying a module folder leaves out, listed: links, editor and cache files."""
    for here, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(here, name)
            why = LINK if path.is_symlink() else CACHE if _SKIP(here, [name]) else ""
            if why:
                report.left_out.append((str(path), why))
                if name in dirs:
                    dirs.remove(name)  # what is inside goes with it


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore: editor and cache files, and every symbolic link."""
    return set(_SKIP(folder, names)) | {n for n in names if Path(folder, n).is_symlink()}


def _pick(found: list[Found], report: CollectReport) -> list[Found]:
    """One notebook per (student, module): the one named as the module, else the newest."""
    groups: dict[tuple[str, str], list[Found]] = {}
    for f in found:
        groups.setdefault((f.student, f.module), []).append(f)
    chosen = []
    for group in groups.values():
        group.sort(key=lambda f: (f.how == "by name", f.notebook.stat().st_mtime), reverse=True)
        chosen.append(group[0])
        for other in group[1:]:
            report.skipped.append((str(other.notebook), f"also {other.module} of "
                                   f"{other.student}; {group[0].notebook.name} was taken"))
    return chosen


def _copy(f: Found, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    if f.folder is not None:
        shutil.copytree(f.folder, dest, ignore=_not_copied)
        if f.notebook.name != f"{f.module}.ipynb":
            (dest / f.notebook.name).rename(dest / f"{f.module}.ipynb")
    else:
        dest.mkdir(parents=True)
        shutil.copy2(f.notebook, dest / f"{f.module}.ipynb")


def _note(f: Found, dest: Path, replaced: bool,
          times: dict[tuple[str, str], dt.datetime]) -> str:
    notes = ["replaced an earlier submission" if replaced else "new"]
    if f.student != f.folder_name:
        notes.append(f"student folder {f.folder_name!r} collected as {f.student!r}")
    if f.notebook.name != f"{f.module}.ipynb":
        notes.append(f"{f.notebook.name!r} matched {f.how}")
    if why := unreadable_reason(dest / f"{f.module}.ipynb"):
        notes.append(f"unreadable notebook ({why}): it will be graded 0 with that message")
    if (dest / "timestamp.txt").exists():
        notes.append("submitted at its timestamp.txt")
    else:
        when, where = submission_time(f.notebook, (f.folder_name, f.student), f.module, times)
        write_timestamp(dest, when)
        notes.append(f"submitted {when:%Y-%m-%d %H:%M} UTC, from {where}")
    return "; ".join(notes)


def collect(source: Path, root: Path = REPO_ROOT, times_csv: Path | None = None) -> CollectReport:
    """Copy every submission in `source` into root/submitted/<student>/<module>/ (see the
    module doc); a submission replaces the student's earlier one for that module."""
    source, root = Path(source).resolve(), Path(root).resolve()
    if not source.is_dir():
        raise SystemExit(f"collect: {source} is not a folder")
    ids = released_ids(root)
    times = load_times(times_csv) if times_csv else {}
    report = CollectReport()
    for f in _pick(_find(source, ids, report), report):
        dest = root / "submitted" / f.student / f.module
        replaced = dest.exists()
        _copy(f, dest)
        report.collected.append((f.student, f.module, _note(f, dest, replaced, times)))
    return report
