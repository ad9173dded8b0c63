"""A learner's workspace on the hub, made as `make lab` makes it: a copy of course/.

Every module of course/ the workspace lacks is copied in; one already there is never touched
(a learner's answers stay; a newer release is carried over with `make update`). With `owner`
(the hub running as root for the system's users) the copies are given to that user and made
readable by them alone. Without `copy` (the hub with nbgrader's exchange) only the folder is
made: the modules come through the exchange (the Assignments tab's Fetch).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

__all__ = ["make_workspace"]


def make_workspace(course: str | os.PathLike[str], dest: str | os.PathLike[str], *,
                   owner: str | None = None, copy: bool = True) -> list[str]:
    """Copy into `dest` every module folder of `course` it lacks; the modules copied."""
    course, dest = Path(course), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    new: list[str] = []
    modules = course.iterdir() if copy else []
    for module in sorted(p for p in modules if p.is_dir() and p.name[:2].isdigit()):
        if not (dest / module.name).exists():
            shutil.copytree(module, dest / module.name)
            new.append(module.name)
    if owner is not None:
        _give(dest, owner)
    return new


def _give(dest: Path, owner: str) -> None:
    """chown -R dest to `owner` and make it theirs alone (chmod 700 on the top folder)."""
    who = pwd.getpwnam(owner)
    for path in [dest, *dest.rglob("*")]:
        os.chown(path, who.pw_uid, who.pw_gid, follow_symlinks=False)
    dest.chmod(0o700)
