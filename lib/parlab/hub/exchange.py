"""nbgrader's exchange on the hub, made private: learners cannot read each other's work.

Under the system's users (PARLAB_HUB_SYSTEM_USERS=1: the hub as root, each server as its
learner's Unix account) the hub's configuration calls `prepare_exchange` once, as root, and
every server (and `make hub-release`, `hub-collect`, `hub-return`) reads
autograder/hub/nbgrader/nbgrader_config.py, which sets `Exchange.root`,
`CourseDirectory.course_id` and `ExchangeFactory.submit = "parlab.hub.exchange.PrivateSubmit"`.

What nbgrader 0.9.6 leaves open, and how it is closed here (autograder/hub/README.md):
- the exchange root is `0777` (nbgrader re-sets it on every release): anyone could rename the
  course folder away. Made `1777` (sticky; nbgrader compares only `& 0o777`, so it stays) and
  the course's folders are made by root before any learner can squat on their names.
- `inbound/` is `2733`: write and search, no listing. Made `3733` (sticky too), so a learner
  who learns a submission's name still cannot rename or delete it.
- a submission folder is `0777` with `0644` files, and the learner's cache copy of it
  (`~/.local/share/jupyter/nbgrader_cache`) `0755`/`0644`: `PrivateSubmit` makes both
  `0700`/`0600` after nbgrader copies them. Only their owner and root (the instructor's
  `collect`) can read them, or put a file in them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nbgrader.exchange.default.submit import ExchangeSubmit

__all__ = ["PrivateSubmit", "exchange_settings", "prepare_exchange", "ExchangeProblem",
           "COURSE_ID", "cannot_reach"]

COURSE_ID = "parlab"
REPO_ROOT = Path(__file__).resolve().parents[3]
ROOT_MODE = 0o1777                 # anyone creates, nobody renames what is not theirs
FOLDERS = {"inbound": 0o3733,      # submit into it, never list it, never rename others'
           "outbound": 0o755,      # the releases: everyone reads them
           "feedback": 0o711}      # returned feedback: fetched by its hash only


class ExchangeProblem(RuntimeError):
    """The exchange cannot be made private as it stands (the message says what to do)."""


def exchange_settings() -> tuple[Path, str]:
    """(exchange root, course id): PARLAB_HUB_EXCHANGE, else <run folder>/exchange (the run
    folder PARLAB_HUB_RUN, else autograder/hub/run); PARLAB_HUB_COURSE_ID, else "parlab"."""
    run = os.environ.get("PARLAB_HUB_RUN") or str(REPO_ROOT / "autograder" / "hub" / "run")
    root = os.environ.get("PARLAB_HUB_EXCHANGE") or os.path.join(run, "exchange")
    return Path(root).resolve(), os.environ.get("PARLAB_HUB_COURSE_ID") or COURSE_ID


def prepare_exchange(root: str | os.PathLike[str], course_id: str = COURSE_ID) -> Path:
    """Make (as root) the exchange root and the course's folders with private modes; return
    the course's folder. Refuses a root or course folder some other user owns (a learner
    who made it first could read everything submitted into it)."""
    if os.geteuid() != 0:
        raise ExchangeProblem("the exchange is made by root (the hub runs as root under "
                              "PARLAB_HUB_SYSTEM_USERS=1; `sudo make hub-release ...`)")
    if not course_id or "/" in course_id or course_id.startswith("."):
        raise ExchangeProblem(f"course id {course_id!r}: give a plain name "
                              "(PARLAB_HUB_COURSE_ID=parlab)")
    root = Path(root)
    course = root / course_id
    for folder, mode in [(root, ROOT_MODE), (course, 0o755),
                         *((course / name, m) for name, m in FOLDERS.items())]:
        folder.mkdir(parents=True, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
            raise ExchangeProblem(f"{folder} is not a folder of root's (owner uid "
                                  f"{info.st_uid}): someone made it before the hub; move it "
                                  "away and start again")
        folder.chmod(mode)
    return course


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's default submit, then the submission and its cached copy made the learner's
    alone (folders 0700, files 0600). nbgrader's collect runs as root and reads them all;
    fetch_feedback reads the learner's own cache, as before."""

    def copy_files(self) -> None:
        super().copy_files()
        name = self.assignment_filename
        cached = name.rsplit("+", 1)[0] if self.add_random_string else name
        for tree in (Path(self.inbound_path) / name, Path(self.cache_path) / cached):
            self.set_perms(str(tree), fileperms=0o600, dirperms=0o700)
        for folder in (Path(self.cache), Path(self.cache_path)):
            folder.chmod(0o700)


def cannot_reach(path: str | os.PathLike[str], *, execute: bool = False) -> str | None:
    """Why another user (not its owner, not in its group) cannot read `path` (or, with
    `execute`, run it): the first folder on the way they cannot search, or the file itself;
    None when they can."""
    path = Path(path).resolve()
    for folder in reversed(path.parents):
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            return f"{folder} is mode {stat.S_IMODE(mode):o}: others cannot enter it"
    need = stat.S_IROTH | (stat.S_IXOTH if execute else 0)
    if path.stat().st_mode & need != need:
        return f"{path} is mode {stat.S_IMODE(path.stat().st_mode):o}"
    return None
