"""Collect never loses a submission silently (`python -m parlab.grading collect`, make collect).

On a made-up course of two released modules (m1, m2: notebooks with nbgrader grade ids, no
nbgrader run needed), an inbox of the ways a hand-in arrives: renamed files (`m1 (1).ipynb`,
`Copy of m2.ipynb`, a learner's own name), two files for one module, an nbgrader folder with a
renamed notebook and its timestamp.txt, a module folder without a notebook, a notebook of no
module, unreadable files with and without a module's name, a file outside any student folder,
a student folder with spaces and non-ASCII letters, and a CSV of submission times. Each is
collected under its module or listed with its reason, and the command exits non-zero.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from parlab.grading import collect
from parlab.grading.collect.times import TimesError, load_times, time_in_name

IDS = {"m1": ["m1_answer", "m1_test", "m1_more"], "m2": ["m2_answer", "m2_test"]}


def _notebook(ids: list[str]) -> str:
    cells = [nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {"grade_id": gid}})
             for gid in ids]
    return nbformat.writes(nbformat.v4.new_notebook(cells=cells))


@pytest.fixture()
def class_inbox(tmp_path: Path) -> tuple[Path, Path, Path]:
    root, inbox = tmp_path / "root", tmp_path / "inbox"
    for module, ids in IDS.items():
        (root / "course" / module).mkdir(parents=True)
        (root / "course" / module / f"{module}.ipynb").write_text(_notebook(ids))
    files = {
        "s1/m1 (1).ipynb": _notebook(IDS["m1"]),
        "s1/Copy of m2.ipynb": _notebook(IDS["m2"][:1]),  # one cell deleted: still m2
        "s2/m1.ipynb": _notebook(IDS["m1"]),
        "s2/m1 (1).ipynb": _notebook(IDS["m1"]),  # a duplicate: m1.ipynb is taken
        "s3/m2/my work.ipynb": _notebook(IDS["m2"]),
        "s3/m2/timestamp.txt": "2026-03-01 12:00:00.000000 UTC",
        "s4/m1/notes.txt": "the notebook is missing",
        "s5/holiday photos.ipynb": _notebook(["something_else"]),
        "s6/m2 broken.ipynb": '{"cells": [',
        "s7/garbage.ipynb": "not json",
        "loose.ipynb": _notebook(IDS["m1"]),
        "Zoë Müller, Jr./Meine Lösung 2026-02-28T09-30-00.ipynb": _notebook(IDS["m2"]),
    }
    for name, text in files.items():
        (inbox / name).parent.mkdir(parents=True, exist_ok=True)
        (inbox / name).write_text(text, encoding="utf-8")
    old = (dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc)).timestamp()
    os.utime(inbox / "s2" / "m1.ipynb", (old, old))
    times = tmp_path / "times.csv"
    times.write_text("Username,Assignment,Last modified (submission)\n"
                     "s1,m1,2026-03-01T17:05:00+01:00\ns1,,\n")
    return root, inbox, times


def _timestamp(root: Path, student: str, module: str) -> str:
    return (root / "submitted" / student / module / "timestamp.txt").read_text()


def test_every_file_is_collected_or_reported(class_inbox) -> None:
    root, inbox, times = class_inbox
    report = collect(inbox, root, times)
    got = {(s, m): note for s, m, note in report.collected}
    assert set(got) == {("s1", "m1"), ("s1", "m2"), ("s2", "m1"), ("s3", "m2"), ("s6", "m2"),
                        ("Zoë_Müller_Jr.", "m2")}, got
    for (student, module), note in got.items():
        assert (root / "submitted" / student / module / f"{module}.ipynb").is_file(), note
    assert "'m1 (1).ipynb' matched by its cells (3 of 3 grade ids)" in got["s1", "m1"]
    assert "matched by its cells (1 of 2 grade ids)" in got["s1", "m2"]
    assert "by a module name in its file name" in got["s6", "m2"]
    assert "unreadable notebook" in got["s6", "m2"]
    assert "collected as 'Zoë_Müller_Jr.'" in got["Zoë_Müller_Jr.", "m2"]
    problems = dict(report.problems)
    assert set(problems) == {str(inbox / p) for p in (
        "s4/m1", "s5/holiday photos.ipynb", "s7/garbage.ipynb", "loose.ipynb")}, problems
    assert problems[str(inbox / "s4/m1")].startswith("MISSING: no m1.ipynb in this module folder")
    assert "belongs to a released module" in problems[str(inbox / "s5/holiday photos.ipynb")]
    assert "names no module" in problems[str(inbox / "s7/garbage.ipynb")]
    assert "not in a student folder" in problems[str(inbox / "loose.ipynb")]
    assert [p for p, _ in report.skipped] == [str(inbox / "s2/m1 (1).ipynb")]
    assert not report.ok


def test_submission_times_come_from_the_right_source(class_inbox) -> None:
    root, inbox, times = class_inbox
    got = {(s, m): note for s, m, note in collect(inbox, root, times).collected}
    assert _timestamp(root, "s3", "m2") == "2026-03-01 12:00:00.000000 UTC"  # nbgrader's, kept
    assert "submitted at its timestamp.txt" in got["s3", "m2"]
    assert _timestamp(root, "s1", "m1") == "2026-03-01 16:05:00.000000 UTC"  # CSV, to UTC
    assert "from the --times CSV" in got["s1", "m1"]
    assert _timestamp(root, "Zoë_Müller_Jr.", "m2") == "2026-02-28 09:30:00.000000 UTC"
    assert "from the file's name" in got["Zoë_Müller_Jr.", "m2"]
    assert _timestamp(root, "s2", "m1") == "2026-01-02 03:04:00.000000 UTC"
    assert "from the file's modification time" in got["s2", "m1"]
    assert "a download may have reset it" in got["s2", "m1"]


def test_the_command_lists_what_it_could_not_collect_and_fails(class_inbox) -> None:
    root, inbox, times = class_inbox
    proc = subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root),
                           "collect", str(inbox), "--times", str(times)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("NOT COLLECTED") == 4 and "MISSING" in out and "SKIPPED" in out, out
    assert "collected 6 submissions" in out and "4 not collected" in out, out


def test_a_clean_inbox_collects_with_exit_0(class_inbox, tmp_path: Path) -> None:
    root, _, _ = class_inbox
    inbox = tmp_path / "clean"
    (inbox / "amy").mkdir(parents=True)
    (inbox / "amy" / "whatever.ipynb").write_text(_notebook(IDS["m2"]))
    proc = subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root),
                           "collect", str(inbox)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (root / "submitted" / "amy" / "m2" / "m2.ipynb").is_file()


def test_a_times_csv_without_the_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("who,when\na,2026-01-01\n")
    with pytest.raises(TimesError, match="needs a student column"):
        load_times(path)
    path.write_text("student,timestamp\na,yesterday-ish\n")
    with pytest.raises(TimesError, match="line 2: cannot read the time"):
        load_times(path)


def test_times_in_file_names() -> None:
    utc = dt.timezone.utc
    assert time_in_name("x_2026-03-01T17-05-00.ipynb") == dt.datetime(2026, 3, 1, 17, 5, 0,
                                                                        tzinfo=utc)
    assert time_in_name("x_20260301-170500.ipynb") == dt.datetime(2026, 3, 1, 17, 5, 0,
                                                                   tzinfo=utc)
    assert time_in_name("02_tensor_parallel (1).ipynb") is None


def test_the_readme_describes_the_columns_grades_csv_has() -> None:
    from parlab.grading.report.export import COLUMNS, STATUSES

    readme = (ROOT / "autograder" / "README.md").read_text()
    section = readme[readme.index("### 4. export"):readme.index("### 5. feedback")]
    described = [line.split("|")[1].strip().strip("`") for line in section.splitlines()
                 if line.startswith("| `")]
    assert described == COLUMNS, f"README's columns {described}, grades.csv's {COLUMNS}"
    for status in STATUSES:
        assert f"`{status}`" in section, f"the README does not describe the status {status!r}"


def test_a_link_or_another_file_beside_a_notebook_gets_its_line(class_inbox,
                                                                tmp_path: Path) -> None:
    """Nothing handed in is dropped without a line: beside a student's notebook a symbolic
    link (to a file of the grader's machine), a dangling one and a readme; in an nbgrader
    module folder a link to a file, a link to a folder, checkpoints. Links are never followed
    (the file they point at is not copied: it could be the answers), a dangling one does not
    stop the collect, and the module folder's own files are still copied."""
    root, _, _ = class_inbox
    inbox, secret = tmp_path / "links", tmp_path / "answers.txt"
    secret.write_text("the answers")
    (inbox / "amy").mkdir(parents=True)
    (inbox / "amy" / "m2.ipynb").write_text(_notebook(IDS["m2"]))
    (inbox / "amy" / "readme.txt").write_text("my notes")
    (inbox / "amy" / "data.txt").symlink_to(secret)
    (inbox / "amy" / "gone.txt").symlink_to(tmp_path / "nowhere")
    module = inbox / "bob" / "m1"
    (module / ".ipynb_checkpoints").mkdir(parents=True)
    (module / "m1.ipynb").write_text(_notebook(IDS["m1"]))
    (module / "helper.py").write_text("x = 1")
    (module / "weights.txt").symlink_to(secret)
    (module / "course").symlink_to(root / "course", target_is_directory=True)
    proc = subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root),
                           "collect", str(inbox)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = {ln.split(": ", 1)[0].removeprefix("LEFT OUT "): ln.split(": ", 1)[1]
            for ln in proc.stdout.splitlines() if ln.startswith("LEFT OUT ")}
    links = [inbox / "amy" / "data.txt", inbox / "amy" / "gone.txt", module / "weights.txt",
             module / "course"]
    assert set(left) == {str(p) for p in [*links, inbox / "amy" / "readme.txt",
                                          module / ".ipynb_checkpoints"]}, proc.stdout
    assert all(left[str(p)].startswith("a symbolic link, not followed") for p in links), left
    assert left[str(inbox / "amy" / "readme.txt")].startswith("not a notebook"), left
    assert "5 not" not in proc.stdout and "6 other files left out" in proc.stdout, proc.stdout
    got = root / "submitted" / "bob" / "m1"
    assert sorted(p.name for p in got.iterdir()) == ["helper.py", "m1.ipynb", "timestamp.txt"]
    assert (root / "submitted" / "amy" / "m2" / "m2.ipynb").is_file()
    assert not [p for p in (root / "submitted").rglob("*") if "the answers" in (
        p.read_text(errors="replace") if p.is_file() else "")], "a link was followed"
