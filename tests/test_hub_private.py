"""parlab.hub.private: on a shared box, another Unix user cannot read what the instructor's
course root keeps (answers, hidden tests, their git history, submissions, grades), and can
still read what learners need (course/, lib/); with the instructors' group, a member of it
reads and writes all of it, and nobody still cannot. Tried for real as the user `nobody`
(setpriv), with and without the group among their groups; the hub's check that the group
exists and holds every instructor names the commands that fix it."""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from parlab.hub.exchange import group_problem
from parlab.hub.private import HIDDEN, INSTRUCTOR_FILES, INSTRUCTOR_FOLDERS, keep_private

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv, to read as another user")


def _as_nobody(path: Path, group: int | None = None, write: bool = False) -> bool:
    """Whether the user nobody (in `group` too, if given) can read `path` (a file: its bytes;
    a folder: its listing), or with `write` make a file in the folder `path`."""
    cmd = (["touch", str(path / "new")] if write else
           ["ls", str(path)] if path.is_dir() else ["cat", str(path)])
    groups = ["--clear-groups"] if group is None else [f"--groups={group}"]
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", *groups, *cmd],
                          capture_output=True).returncode == 0


def _course_root(root: Path) -> list[Path]:
    """A course root as git and umask 022 leave it; the files learners must not read."""
    for name in (*HIDDEN, "course", "lib", "submitted/alice/00"):
        (root / name).mkdir(parents=True)
        (root / name / "x.ipynb").write_text("{}")
    made = [n for n in INSTRUCTOR_FILES if n != "gradebook.db"]  # the instructor's commands'
    for name in made:
        (root / name).write_text("alice,10")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return [root / n / "x.ipynb" for n in (*HIDDEN, "submitted/alice/00")] + [
        root / n for n in made]


@pytest.fixture
def course_root():
    """A course root another user can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="parlab-private-"))
    base.chmod(0o755)
    yield base / "course_root"
    shutil.rmtree(base)


def test_learners_cannot_read_what_the_course_root_keeps(course_root: Path) -> None:
    root = course_root
    secret = _course_root(root)
    assert all(_as_nobody(p) for p in secret), "nobody should read them before (the test)"

    changed = keep_private(root)

    assert not [p for p in secret if _as_nobody(p)], "still readable by another user"
    assert all((root / n).is_dir() for n in INSTRUCTOR_FOLDERS)
    assert all((root / n).stat().st_mode & 0o777 == 0o600 for n in INSTRUCTOR_FILES)
    assert _as_nobody(root / "course" / "x.ipynb") and _as_nobody(root / "lib" / "x.ipynb")
    assert any("solutions" in line for line in changed), changed
    assert keep_private(root) == [], "a second call finds everything private"


@pytest.fixture
def group():
    """A Unix group made for the test (removed after); its gid."""
    name = f"plt-priv-{os.getpid()}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def test_the_instructors_group_reads_and_writes_what_learners_cannot(
        course_root: Path, group: int) -> None:
    root = course_root
    secret = _course_root(root)
    assert not _as_nobody(root, group, write=True), "the course root is root's (the test)"

    changed = keep_private(root, group=group)

    assert keep_private(root, group=group) == [], "a second call finds everything so"
    assert not [p for p in secret if _as_nobody(p)], "still readable by another user"
    assert not [p for p in secret if not _as_nobody(p, group)], "the group cannot read"
    for folder in (root, *(root / n for n in (*HIDDEN, *INSTRUCTOR_FOLDERS)),
                   root / "submitted" / "alice" / "00"):
        assert _as_nobody(folder, group, write=True), f"the group cannot write in {folder}"
        assert folder.stat().st_mode & 0o2000, f"{folder}: no setgid, new files lose the group"
    for name in INSTRUCTOR_FILES:
        assert (root / name).stat().st_mode & 0o777 == 0o660 and _as_nobody(root / name, group)
    assert not _as_nobody(root / "gradebook.db") and not _as_nobody(root / "solutions", write=True)
    made = root / "autograded" / "new"                    # made by the group, umask 022
    assert made.stat().st_gid == group and not _as_nobody(made)
    assert _as_nobody(root / "course" / "x.ipynb") and _as_nobody(root / "lib" / "x.ipynb")
    assert any("solutions/*" in line for line in changed), changed


def test_the_hub_names_the_commands_for_a_missing_group_or_member() -> None:
    missing = group_problem("plt-no-such-group", ["root"])
    assert missing and "groupadd plt-no-such-group" in missing, missing
    outside = group_problem("root", ["root", "nobody"])       # nobody is not in root's group
    assert outside and "usermod -aG root nobody" in outside and "root," not in outside, outside
    assert group_problem("root", ["root"]) is None
    assert "adduser plt-no-such-user" in (group_problem("root", ["plt-no-such-user"]) or "")
