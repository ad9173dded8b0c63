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
- `inbound/` is `2733`: write and search, no listing. Made `3773` (sticky too), so a learner
  who learns a submission's name still cannot rename or delete it; its group is the
  instructors' Unix group (PARLAB_HUB_INSTRUCTOR_GROUP, default `parlab-instructors`), which
  may list it, and, setgid, gives every submission folder made in it that group.
- a submission folder is `0777` with `0644` files, and the learner's cache copy of it
  (`~/.local/share/jupyter/nbgrader_cache`) `0755`/`0644`: `PrivateSubmit` makes the
  submission `0750` (group: the instructors') with `0640` files, and the cache copy
  `0700`/`0600`. Other learners (not in the group) cannot enter it; an instructor (in the
  group, no root) collects it. nbgrader writes `timestamp.txt` and `submission_secret.txt`
  after copying, when the folder has lost its setgid bit (copytree's copystat; a learner,
  not in the group, cannot set it again): they carry the learner's group, so they are made
  `0644`, readable by the group through the `0750` folder that others cannot enter.
- `outbound/` (`2775`) and `feedback/` (`2771`) are the group's too: an instructor releases
  into them and returns feedback without root. nbgrader refuses a folder it does not own
  unless `CourseDirectory.groupshared` (its setting for instructors sharing a course), which
  the exchange's configuration sets for root and the group's members (`instructor_side`).
- `fetched/` (`3773`, the group's, as inbound) is ours: each fetch leaves a record there
  (`parlab.hub.records`), for the instructor's `make status`.
"""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from nbgrader.exchange.default.submit import ExchangeSubmit

__all__ = ["PrivateSubmit", "exchange_settings", "prepare_exchange", "ExchangeProblem",
           "COURSE_ID", "INSTRUCTOR_GROUP", "cannot_reach", "group_problem", "instructor_gid",
           "instructor_side"]

COURSE_ID = "parlab"
INSTRUCTOR_GROUP = "parlab-instructors"
REPO_ROOT = Path(__file__).resolve().parents[3]
ROOT_MODE = 0o1777                 # anyone creates, nobody renames what is not theirs
FOLDERS = {"inbound": 0o3773,      # learners submit, never list, never rename others'
           "outbound": 0o2775,     # the releases: everyone reads them, the group writes
           "feedback": 0o2771,     # returned feedback: fetched by its hash only
           "fetched": 0o3773}      # a record of each fetch, as inbound (parlab.hub.records)


class ExchangeProblem(RuntimeError):
    """The exchange cannot be made private as it stands (the message says what to do)."""


def exchange_settings() -> tuple[Path, str]:
    """(exchange root, course id): PARLAB_HUB_EXCHANGE, else <run folder>/exchange (the run
    folder PARLAB_HUB_RUN, else autograder/hub/run); PARLAB_HUB_COURSE_ID, else "parlab"."""
    run = os.environ.get("PARLAB_HUB_RUN") or str(REPO_ROOT / "autograder" / "hub" / "run")
    root = os.environ.get("PARLAB_HUB_EXCHANGE") or os.path.join(run, "exchange")
    return Path(root).resolve(), os.environ.get("PARLAB_HUB_COURSE_ID") or COURSE_ID


def _group_name() -> str:
    return os.environ.get("PARLAB_HUB_INSTRUCTOR_GROUP") or INSTRUCTOR_GROUP


def instructor_gid(group: str | None = None) -> int:
    """The instructors' group's id (PARLAB_HUB_INSTRUCTOR_GROUP, default parlab-instructors);
    ExchangeProblem, naming the command that makes it, when the box has no such group."""
    group = group or _group_name()
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ExchangeProblem(f"there is no Unix group {group!r} for the instructors: make it "
                              f"with `groupadd {group}` and add each instructor with "
                              f"`usermod -aG {group} <instructor>`") from None


def group_problem(group: str, instructors: Iterable[str]) -> str | None:
    """Why the hub cannot start with `group` as the instructors' group: it is missing, or an
    instructor's account is missing or not in it (with the commands that fix it); else None."""
    try:
        gid = instructor_gid(group)
    except ExchangeProblem as exc:
        return str(exc)
    members = set(grp.getgrgid(gid).gr_mem)
    outside = []
    for name in instructors:
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            return f"the instructor {name!r} has no Unix account: `adduser {name}`"
        if name not in members and account.pw_gid != gid:
            outside.append(name)
    if outside:
        return (f"instructors not in the group {group!r}: "
                + ", ".join(outside) + "; add them with "
                + "; ".join(f"`usermod -aG {group} {n}`" for n in outside))
    return None


def instructor_side(group: str | None = None) -> bool:
    """Whether this process is root or in the instructors' group (nbgrader's groupshared)."""
    if os.geteuid() == 0:
        return True
    try:
        gid = grp.getgrnam(group or _group_name()).gr_gid
    except KeyError:
        return False
    return gid == os.getegid() or gid in os.getgroups()


def prepare_exchange(root: str | os.PathLike[str], course_id: str = COURSE_ID,
                     group: str | None = None) -> Path:
    """Make (as root) the exchange root and the course's folders with private modes, the
    course's folders given to the instructors' `group`; return the course's folder. Refuses a
    root or course folder some other user owns (a learner who made it first could read
    everything submitted into it). As anyone else (an instructor's `make hub-release`),
    check instead that the hub made it so and that they are in the group."""
    if not course_id or "/" in course_id or course_id.startswith("."):
        raise ExchangeProblem(f"course id {course_id!r}: give a plain name "
                              "(PARLAB_HUB_COURSE_ID=parlab)")
    group = group or _group_name()
    gid = instructor_gid(group)
    root = Path(root)
    course = root / course_id
    making = os.geteuid() == 0
    if not making and not instructor_side(group):
        raise ExchangeProblem(f"you are not in the instructors' group {group!r}: "
                              f"`sudo usermod -aG {group} {pwd.getpwuid(os.getuid())[0]}`, "
                              "then log in again (or work as root)")
    for folder, mode, owner_gid in [(root, ROOT_MODE, None), (course, 0o755, None),
                                    *((course / n, m, gid) for n, m in FOLDERS.items())]:
        if making:
            folder.mkdir(parents=True, exist_ok=True)
        try:
            info = folder.lstat()
        except FileNotFoundError:
            raise ExchangeProblem(f"{folder} does not exist: the hub makes the exchange as "
                                  "root when it starts; start it, or run this as root") from None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
            raise ExchangeProblem(f"{folder} is not a folder of root's (owner uid "
                                  f"{info.st_uid}): someone made it before the hub; move it "
                                  "away and start again")
        if making:
            if owner_gid is not None:
                os.chown(folder, 0, owner_gid)
            folder.chmod(mode)
        elif stat.S_IMODE(info.st_mode) != mode or owner_gid not in (None, info.st_gid):
            raise ExchangeProblem(f"{folder} is mode {stat.S_IMODE(info.st_mode):o}, group "
                                  f"{info.st_gid}, not {mode:o}, group {group}: restart the "
                                  "hub (as root), which makes it so")
    return course


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's default submit, then the submission readable by its learner and the
    instructors' group only (folders 0750, files 0640; nbgrader's timestamp.txt and
    submission_secret.txt, which carry the learner's group, 0644 behind the 0750 folder), and
    the cached copy the learner's alone (0700, 0600). Instructors collect without root.
    Its check of the notebooks handed in leaves out what the copy leaves out
    (`CourseDirectory.ignore`): nbgrader's own listed JupyterLab's
    `.ipynb_checkpoints/<name>-checkpoint.ipynb` as an EXTRA notebook of every submission, which
    it never copies."""

    def check_filename_diff(self) -> None:
        released = _notebooks(Path(self.release_path), [])
        handed_in = _notebooks(Path(self.src_path), self.coursedir.ignore)
        missing, extra = sorted(released - handed_in), sorted(handed_in - released)
        if not missing and not extra:
            return
        diff = ("Expected:\n\t" + "\n\t".join(f"{n}: {'MISSING' if n in missing else 'FOUND'}"
                                                for n in sorted(released))
                + "\nSubmitted:\n\t" + "\n\t".join(f"{n}: {'EXTRA' if n in extra else 'OK'}"
                                                    for n in sorted(handed_in)))
        if missing and self.strict:
            self.fail(f"Assignment {self.coursedir.assignment_id} not submitted. There are "
                      f"missing notebooks for the submission:\n{diff}")
        self.log.warning("Possible missing notebooks and/or extra notebooks submitted for "
                         "assignment %s:\n%s", self.coursedir.assignment_id, diff)

    def copy_files(self) -> None:
        super().copy_files()
        name = self.assignment_filename
        cached = name.rsplit("+", 1)[0] if self.add_random_string else name
        gid = os.stat(self.inbound_path).st_gid
        folders = []
        for folder, _, files in os.walk(Path(self.inbound_path) / name):
            for file in files:
                path = os.path.join(folder, file)
                os.chmod(path, 0o640 if os.stat(path).st_gid == gid else 0o644)
            folders.append(folder)
        for folder in reversed(folders):
            os.chmod(folder, 0o750)
        self.set_perms(str(Path(self.cache_path) / cached), fileperms=0o600, dirperms=0o700)
        for path in (Path(self.cache), Path(self.cache_path)):
            path.chmod(0o700)


def _notebooks(top: Path, ignore: Iterable[str]) -> set[str]:
    """The notebooks under `top` (relative paths), without those in or named by a pattern
    of `ignore`, as nbgrader's copy skips them."""
    found = set()
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, g) for g in ignore)]
        for name in files:
            if name.endswith(".ipynb") and not any(fnmatch.fnmatch(name, g) for g in ignore):
                found.add(os.path.relpath(os.path.join(folder, name), top))
    return found


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
