"""parlab.hub.private: on a shared box, another Unix user cannot read what the instructor's
course root keeps (answers, hidden tests, their git history, submissions, grades), and can
still read what learners need (course/, lib/). Tried for real as the user `nobody`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from parlab.hub.private import HIDDEN, INSTRUCTOR_FILES, INSTRUCTOR_FOLDERS, keep_private

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv, to read as another user")


def _as_nobody(path: Path) -> bool:
    """Whether the user nobody can read `path` (a file: its bytes; a folder: its listing)."""
    cmd = ["ls", str(path)] if path.is_dir() else ["cat", str(path)]
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
                          capture_output=True).returncode == 0


@pytest.fixture
def course_root():
    """A course root another user can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="parlab-private-"))
    base.chmod(0o755)
    yield base / "course_root"
    shutil.rmtree(base)


def test_learners_cannot_read_what_the_course_root_keeps(course_root: Path) -> None:
    root = course_root
    for name in (*HIDDEN, "course", "lib", "submitted/alice/00"):
        (root / name).mkdir(parents=True)
        (root / name / "x.ipynb").write_text("{}")
    for name in ("grades.csv", "report.html"):
        (root / name).write_text("alice,10")
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # as git and umask 022 make them
    secret = [root / n / "x.ipynb" for n in (*HIDDEN, "submitted/alice/00")] + [
        root / n for n in ("grades.csv", "report.html")]
    assert all(_as_nobody(p) for p in secret), "nobody should read them before (the test)"

    changed = keep_private(root)

    assert not [p for p in secret if _as_nobody(p)], "still readable by another user"
    assert all((root / n).is_dir() for n in INSTRUCTOR_FOLDERS)
    assert all((root / n).stat().st_mode & 0o777 == 0o600 for n in INSTRUCTOR_FILES)
    assert _as_nobody(root / "course" / "x.ipynb") and _as_nobody(root / "lib" / "x.ipynb")
    assert any("solutions" in line for line in changed), changed
    assert keep_private(root) == [], "a second call finds everything private"
