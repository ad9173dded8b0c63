"""The end of a term: archive the grades, then remove what the class left on the box.

    sudo make hub-teardown PARLAB_HUB_SYSTEM_USERS=1 PARLAB_HUB_LEARNERS=ann,ben,cy   # asks
    sudo make hub-teardown ... YES=1                                 # no question (scripts)

With the settings the hub ran with, after the hub has stopped. First it prints all it will do
and asks for `yes`; then, in this order:

1. archives, into `<course root>/parlab-term-<course>-<date>.tar.gz` (the instructors' group,
   0640): `gradebook.db`, `grades.csv` (exported again first), `feedback/`, the class list
   `roster.json`, and `status.txt` (`make status` of every module). Nothing is removed if
   this fails;
2. ends the learners' processes, then removes their Unix accounts with their homes (`userdel
   -r`: the workspace `~<learner>/parlab` and nbgrader's cache in it), under the system's
   users (PARLAB_HUB_SYSTEM_USERS=1) only: in the trial a learner's name is no account of the
   box, and its workspace `autograder/hub/run/users/<learner>` is removed instead;
3. removes the course's folder in nbgrader's exchange (`inbound/`, `outbound/`, `feedback/`,
   `fetched/`: every hand-in and returned feedback);
4. removes their files directly in /tmp and /dev/shm (`parlab-scratch-<uid>`, Python's
   `pymp-*`, torch's shared memory): what `userdel -r` leaves behind, and the one-time
   passwords `make hub-roster` wrote (`<hub run>/roster-passwords-*.txt`).

The learners are PARLAB_HUB_LEARNERS, the class list's students (`make hub-roster`, active and
retired: parlab.hub.roster) and the gradebook's students. An account is never removed
when it is root's or a system account's (uid below UID_MIN of /etc/login.defs), an instructor's
(PARLAB_HUB_INSTRUCTORS, or a member of the instructors' group), or the one running this: such
a name is printed as kept, with why. The course root's `submitted/`, `autograded/`,
`feedback/` and `gradebook.db` stay where they are (the archive has the grades): remove them by
hand once you have checked the archive, before the next term's first collect.
"""

from __future__ import annotations

import argparse
import datetime as dt
import grp
import io
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from parlab.hub.exchange import REPO_ROOT, exchange_settings
from parlab.hub.roster import ROSTER_FILE, Roster

__all__ = ["Plan", "make_plan", "describe", "carry_out", "main"]

SYSTEM_UID_MIN = 1000
ARCHIVED = ("gradebook.db", "grades.csv", "feedback", ROSTER_FILE)


@dataclass
class Plan:
    """What the teardown does (see the module docstring)."""

    root: Path                                   # the course root
    archive: Path                                # the tarball it writes
    accounts: dict[str, int] = field(default_factory=dict)        # name: uid (userdel -r)
    kept: dict[str, str] = field(default_factory=dict)            # name: why not removed
    workspaces: list[Path] = field(default_factory=list)
    exchange: Path | None = None                 # the course's folder in the exchange
    temp: list[Path] = field(default_factory=list)    # in /tmp, /dev/shm; one-time passwords
    processes: list[int] = field(default_factory=list)


def course_root() -> Path:
    """PARLAB_COURSE_ROOT, else the repository."""
    return Path(os.environ.get("PARLAB_COURSE_ROOT") or REPO_ROOT).resolve()


def gradebook_students(root: Path) -> list[str]:
    """The gradebook's students, read without nbgrader (and without ever making it)."""
    try:
        with sqlite3.connect(f"file:{root / 'gradebook.db'}?mode=ro", uri=True) as con:
            return sorted(row[0] for row in con.execute("SELECT id FROM student"))
    except sqlite3.Error:           # no gradebook, or an empty one
        return []


def _grading(*args: str) -> str:
    """`python -m parlab.grading...` (make export, make status) on the course root: its output."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def _uid_min() -> int:
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "UID_MIN":
                return int(parts[1])
    except (OSError, ValueError):
        pass
    return SYSTEM_UID_MIN


def _names(variable: str, default: str = "") -> list[str]:
    return [n.strip() for n in os.environ.get(variable, default).split(",") if n.strip()]


def _why_kept(name: str, account: pwd.struct_passwd, instructors: set[str]) -> str | None:
    if account.pw_uid == 0 or account.pw_uid < _uid_min():
        return f"uid {account.pw_uid} is root's or a system account's"
    if name in instructors:
        return "an instructor"
    if name in {os.environ.get("SUDO_USER"), pwd.getpwuid(os.getuid()).pw_name}:
        return "the account running this"
    return None


def _instructors() -> set[str]:
    names = set(_names("PARLAB_HUB_INSTRUCTORS", "instructor"))
    group = os.environ.get("PARLAB_HUB_INSTRUCTOR_GROUP") or "parlab-instructors"
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return names
    members = set(entry.gr_mem)
    members |= {a.pw_name for a in pwd.getpwall() if a.pw_gid == entry.gr_gid}
    return names | members


def _theirs(uids: set[int]) -> tuple[list[Path], list[int]]:
    """Their files directly in /tmp and /dev/shm, and their processes."""
    files = []
    for top in {Path(tempfile.gettempdir()), Path("/dev/shm")}:
        try:
            entries = list(top.iterdir())
        except OSError:
            continue
        for path in entries:
            try:
                if path.lstat().st_uid in uids:
                    files.append(path)
            except OSError:
                continue
    procs = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if proc.stat().st_uid in uids:
                    procs.append(int(proc.name))
            except OSError:
                continue
    return sorted(files), sorted(procs)


def make_plan(root: Path | None = None, archive_dir: Path | None = None) -> Plan:
    """What to archive and remove, from the hub's settings (the environment) and the
    gradebook; nothing is changed."""
    root = (root or course_root()).resolve()
    exchange_root, course = exchange_settings()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M")
    plan = Plan(root, (archive_dir or root) / f"parlab-term-{course}-{stamp}.tar.gz")
    learners = sorted(set(_names("PARLAB_HUB_LEARNERS")) | set(gradebook_students(root))
                      | set(Roster.load(root).students))
    system_users = os.environ.get("PARLAB_HUB_SYSTEM_USERS") == "1"
    run = Path(os.environ.get("PARLAB_HUB_RUN") or REPO_ROOT / "autograder" / "hub" / "run")
    instructors = _instructors()
    for name in learners:
        if not system_users:
            if (run / "users" / name).is_dir():
                plan.workspaces.append(run / "users" / name)
            continue
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            plan.kept[name] = "no Unix account of that name"
            continue
        why = _why_kept(name, account, instructors)
        if why:
            plan.kept[name] = why
            continue
        plan.accounts[name] = account.pw_uid
    if (exchange_root / course).is_dir():
        plan.exchange = exchange_root / course
    plan.temp, plan.processes = _theirs(set(plan.accounts.values()))
    plan.temp += sorted(run.glob("roster-passwords-*.txt"))
    return plan


def describe(plan: Plan) -> str:
    archived = [n for n in ARCHIVED if (plan.root / n).exists()] + ["status.txt"]
    lines = [f"archive into {plan.archive}: {', '.join(archived)}"]
    for name, uid in plan.accounts.items():
        home = Path(pwd.getpwnam(name).pw_dir)
        lines.append(f"remove the account {name} (uid {uid}) and its home {home}"
                     + (f" with the workspace {home / 'parlab'}" if (home / "parlab").is_dir()
                        else "") + " (userdel -r)")
    lines += [f"remove the workspace {w}" for w in plan.workspaces]
    if plan.exchange:
        lines.append(f"remove the course's exchange folder {plan.exchange} (every hand-in "
                     "and returned feedback)")
    if plan.processes:
        lines.append(f"end the learners' processes ({len(plan.processes)}): "
                     + " ".join(map(str, plan.processes)))
    lines += [f"remove {p} (" + ("the class list's one-time passwords)"
                                  if p.name.startswith("roster-passwords-")
                                  else "the learners' file)") for p in plan.temp]
    lines += [f"keep {name}: {why}" for name, why in plan.kept.items()]
    return "\n".join(lines)


def _archive(plan: Plan) -> None:
    if gradebook_students(plan.root):
        _grading("parlab.grading", "--root", str(plan.root), "export", "--to",
                 str(plan.root / "grades.csv"))
    status = _grading("parlab.grading.report.status", "--root", str(plan.root))
    partial = plan.archive.with_name(plan.archive.name + ".part")
    with tarfile.open(partial, "w:gz") as tar:
        for name in ARCHIVED:
            if (plan.root / name).exists():
                tar.add(plan.root / name, arcname=name)
        text = status.encode()
        info = tarfile.TarInfo("status.txt")
        info.size, info.mtime = len(text), int(time.time())
        tar.addfile(info, io.BytesIO(text))
    gid = os.stat(plan.root).st_gid
    os.chown(partial, -1, gid)
    partial.chmod(0o640)
    partial.rename(plan.archive)


def carry_out(plan: Plan) -> None:
    """Do it, printing each step (the module docstring's order)."""
    _archive(plan)
    print(f"archived: {plan.archive}")
    for pid in plan.processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    if plan.processes:
        print(f"ended the learners' processes ({len(plan.processes)})")
        time.sleep(0.2)
    for name in plan.accounts:
        done = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
        if done.returncode not in (0, 12):      # 12: the home could not be removed in full
            print(f"NOT REMOVED: the account {name}: {done.stderr.strip()}")
        else:
            print(f"removed: the account {name} and its home")
    for path in plan.workspaces:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            print(f"removed: {path}")
    if plan.exchange is not None:
        shutil.rmtree(plan.exchange)
        print(f"removed: {plan.exchange}")
    for path in plan.temp:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        print(f"removed: {path}")
    for name, why in plan.kept.items():
        print(f"kept: {name} ({why})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.hub.teardown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yes", action="store_true", help="do not ask (make ... YES=1)")
    parser.add_argument("--archive-dir", type=Path, default=None,
                        help="where the archive goes (default: the course root)")
    args = parser.parse_args(argv)
    if os.environ.get("PARLAB_HUB_SYSTEM_USERS") == "1" and os.geteuid() != 0:
        print("make hub-teardown removes Unix accounts: run it as root (sudo make "
              "hub-teardown ...)", file=sys.stderr)
        return 2
    plan = make_plan(archive_dir=args.archive_dir)
    print("The end of the term: this will\n" + describe(plan))
    if not args.yes:
        try:
            answer = input("Type yes to go on: ")
        except EOFError:
            answer = ""
        if answer.strip() != "yes":
            print("nothing done")
            return 1
    carry_out(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
