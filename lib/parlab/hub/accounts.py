"""Unix accounts for the class list, under the system's users (`make hub-roster`, as root).

- a new student: `useradd -m` (their name as the comment) and, when the hub's login is PAM,
  a one-time password (`chpasswd`) written to a file only root can read; with a login from a
  learning platform (LTI) no password at all (the account's password stays locked).
- a retired student: `usermod -L -e 1`: the password locked (its hash kept) and the account
  expired, so PAM (the hub's login, ssh) refuses them; the account, its home and its files
  stay. A student listed again: `usermod -U -e ''` (the old password works again).
- an account that exists already (made by hand with `adduser`): its password is left as it
  is; an account of the system (uid below 1000: `daemon`, `root`) is refused as a student.

Expired passwords (`chage -d 0`, "change at first login") are not used: JupyterHub's PAM
login (pamela.authenticate, then check_account) refuses an expired password with "PAM Error
12, Authentication token is no longer valid; new one required" and has no page to change it
(measured with JupyterHub 6.1 and pamela 1.2; tests/test_hub_roster.py): the learner would be
locked out. A learner changes the one-time password with `passwd` in a terminal of their
server instead.
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
from collections.abc import Iterable
from pathlib import Path

from parlab.hub.roster import Student

__all__ = ["AccountProblem", "check_accounts", "make_accounts", "lock_accounts",
           "write_passwords", "FIRST_UID"]

FIRST_UID = 1000       # below: the system's own accounts (Debian's adduser.conf FIRST_UID)


class AccountProblem(RuntimeError):
    """The accounts cannot be made as asked; the message says what to do."""


def _account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _run(*cmd: str, stdin: str | None = None) -> None:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AccountProblem(f"{' '.join(cmd[:3])} ... exited {proc.returncode}: "
                             f"{proc.stderr.strip()[:300]}")


def _shadow_hash(name: str) -> str:
    """The password field of /etc/shadow ("!" alone: no password was ever set)."""
    out = subprocess.run(["getent", "shadow", name], capture_output=True, text=True).stdout
    return out.split(":")[1] if out.count(":") > 1 else ""


def check_accounts(students: Iterable[Student]) -> None:
    """Refuse, before changing anything, to take a system account as a student's, or to run
    without root."""
    if os.geteuid() != 0:
        raise AccountProblem("Unix accounts need root: sudo make hub-roster ... "
                             "PARLAB_HUB_SYSTEM_USERS=1")
    system = [f"{s.id} (uid {a.pw_uid})" for s in students
              if (a := _account(s.id)) is not None and a.pw_uid < FIRST_UID]
    if system:
        raise AccountProblem(f"these ids are accounts of the system, not students: "
                             f"{', '.join(system)}: fix the class list")


def make_accounts(students: Iterable[Student], *, passwords: bool,
                  returning: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """Accounts for new students, and unlocked for `returning` ones (retired, listed again):
    ({id: one-time password} of the accounts made here when `passwords`, lines saying what
    was done). An account that exists and is not returning is left as it is."""
    made: dict[str, str] = {}
    said: list[str] = []
    back = set(returning)
    for s in students:
        account = _account(s.id)
        if account is None:
            comment = s.name.replace(":", " ").replace(",", " ").replace("\n", " ")
            _run("useradd", "-m", "-s", "/bin/bash", "-c", comment, s.id)
            if passwords:
                made[s.id] = secrets.token_urlsafe(9)
                _run("chpasswd", stdin=f"{s.id}:{made[s.id]}\n")
            said.append(f"account {s.id}: made" + (", one-time password" if passwords else
                                                     " (no password: the platform logs in)"))
        elif s.id in back:
            if _shadow_hash(s.id).startswith("!") and len(_shadow_hash(s.id)) > 1:
                _run("usermod", "-U", s.id)
            _run("usermod", "-e", "", s.id)
            said.append(f"account {s.id}: unlocked, its password as it was")
        else:
            said.append(f"account {s.id}: exists already (uid {account.pw_uid}), left as it is")
    return made, said


def lock_accounts(students: Iterable[Student]) -> list[str]:
    """Lock the accounts of retired students (password locked, account expired); never
    delete."""
    said = []
    for s in students:
        if _account(s.id) is None:
            said.append(f"account {s.id}: none to lock")
            continue
        _run("usermod", "-L", "-e", "1", s.id)
        said.append(f"account {s.id}: locked and expired (home and files kept)")
    return said


def write_passwords(run: Path, made: dict[str, str], stamp: str) -> Path:
    """The one-time passwords in <run>/roster-passwords-<stamp>.txt, mode 0600 (root's)."""
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"roster-passwords-{stamp}.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# one-time passwords of the accounts `make hub-roster` made; hand each to its "
                "learner, who changes it with `passwd` in a terminal of their server\n")
        f.writelines(f"{sid} {pw}\n" for sid, pw in sorted(made.items()))
    return path
