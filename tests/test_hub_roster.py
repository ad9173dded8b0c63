"""`make hub-roster ROSTER=class.csv`: the class list into the gradebook, the hub's learners and
the box's Unix accounts, and a second and third run that retire and bring back a student.

The class-list tests at the top run in `make test` (no root): the CSV read by its headers, the
hub's login gate (parlab.hub.roster.LoginGate) and the hub's configuration with a class list
and with each LTI login. `test_the_roster_as_the_box_users` runs with `make test-hub`, as
root: `make hub-roster` itself with PARLAB_HUB_SYSTEM_USERS=1 on a course root whose gradebook
holds a graded submission of plt-ben (2 points, made with nbgrader's API), three students
(plt-ann, plt-ben, plt-cy): accounts made with a one-time password each, in a file only root
reads, with which PAM logs them in as JupyterHub's PAM login does (pamela.authenticate, then
check_account); an expired password is refused there (why the accounts are not expired).
Second run without plt-ben, with plt-dee and a new email for plt-ann: plt-ben retired, his
submission and its 2 points still in the gradebook, his account locked and expired (PAM
refuses him, his home kept), the gate refuses him; plt-dee made. Third run with plt-ben again:
unlocked, his old password works. The accounts are removed at the end, whatever happens.
"""

from __future__ import annotations

import contextlib
import csv
import os
import pwd
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_hub_allot import load_config
from tornado.web import HTTPError

from parlab.hub.roster import LoginGate, Roster, RosterError, read_class_csv

HUB = pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1" or os.geteuid() != 0
                         or shutil.which("useradd") is None,
                         reason="as root with `make test-hub`: the test makes Unix accounts")
STUDENTS = {"plt-ann": ("Ann", "Lee", "ann@example.edu"),
            "plt-ben": ("Ben", "Okafor", "ben@example.edu"),
            "plt-cy": ("Cy", "Twombly", "cy@example.edu"),
            "plt-dee": ("Dee", "Ødegård", "dee@example.edu")}


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


# --- the class list, the gate, the configuration (make test) ---------------------------------

def test_the_class_list_is_read_by_its_headers(tmp_path):
    """Canvas's gradebook export: the login from SIS Login ID, Canvas's ID as the platform id,
    the name "Last, First", the Points Possible row skipped."""
    canvas = write_csv(tmp_path / "canvas.csv", [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"],
        ["Points Possible", "", "", "", ""],
        ["Lee, Ann", "101", "S-1", "ann", "A"], ["Okafor, Ben", "102", "S-2", "ben", "B"]])
    ann, ben = read_class_csv(canvas)
    assert (ann.id, ann.first_name, ann.last_name, ann.lms_user_id, ann.sis_user_id,
            ann.section) == ("ann", "Ann", "Lee", "101", "S-1", "A")
    assert ben.id == "ben"
    with pytest.raises(RosterError, match="'Ann.Lee'.*lowercase"):
        read_class_csv(write_csv(tmp_path / "bad.csv", [["username", "email"],
                                                        ["Ann.Lee", "a@x"]]))
    with pytest.raises(RosterError, match="no student id column: its header is"):
        read_class_csv(write_csv(tmp_path / "none.csv", [["who", "email"], ["ann", "a@x"]]))
    with pytest.raises(RosterError, match="'ann' is on lines 2 and 3"):
        read_class_csv(write_csv(tmp_path / "twice.csv", [["id"], ["ann"], ["ann"]]))


def test_the_gate_reads_the_class_list_at_every_login(tmp_path):
    roster = Roster.load(tmp_path)
    gate = LoginGate(tmp_path, ["guest"], ["teacher"])
    with pytest.raises(HTTPError, match="ann is not on this course's class list"):
        gate(None, None, {"name": "ann"})
    for who in read_class_csv(write_csv(tmp_path / "c.csv", [
            ["id", "username"], ["9001", "ann"], ["9002", "ben"]])):
        roster.students[who.id] = who
    roster.students["ben"].status, roster.students["ben"].since = "retired", "2026-03-01T00:00"
    roster.save()
    assert gate(None, None, {"name": "ann"})["name"] == "ann"          # no restart needed
    assert gate(None, None, {"name": "9001"})["name"] == "ann"         # the platform's id
    assert gate(None, None, {"name": "teacher"})["name"] == "teacher"
    with pytest.raises(HTTPError, match="ben was retired .* on 2026-03-01"):
        gate(None, None, {"name": "ben"})
    with pytest.raises(HTTPError, match="ben was retired"):
        gate(None, None, {"name": "9002"})


def test_the_hub_takes_its_learners_from_the_class_list(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLAB_COURSE_ROOT", str(tmp_path))
    monkeypatch.delenv("PARLAB_HUB_LEARNERS", raising=False)
    write_csv(tmp_path / "c.csv", [["username"], ["ann"]])
    roster = Roster.load(tmp_path)
    roster.students["ann"] = read_class_csv(tmp_path / "c.csv")[0]
    roster.save()
    c = load_config(tmp_path, monkeypatch)
    gate = c.Authenticator.post_auth_hook
    assert isinstance(gate, LoginGate) and c.Authenticator.allow_all is True
    assert gate(None, None, {"name": "ann"})["name"] == "ann"
    with pytest.raises(HTTPError):                    # the trial's alice is not added
        gate(None, None, {"name": "alice"})


def test_each_lti_login_is_set_from_settings(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit, match="PARLAB_HUB_LTI_ISSUER, PARLAB_HUB_LTI_JWKS_URL"):
        load_config(tmp_path, monkeypatch, LOGIN="lti13", LTI_CLIENT_ID="c",
                    LTI_AUTHORIZE_URL="https://lms/auth")
    c = load_config(tmp_path, monkeypatch, LOGIN="lti13", LTI_ISSUER="https://lms",
                    LTI_CLIENT_ID="c1,c2", LTI_AUTHORIZE_URL="https://lms/auth",
                    LTI_JWKS_URL="https://lms/jwks")
    assert c.JupyterHub.authenticator_class.endswith("lti13.auth.LTI13Authenticator")
    assert c.LTI13Authenticator.client_id == {"c1", "c2"}
    assert c.LTI13Authenticator.username_key == "custom_username"
    assert "/hub/lti13/oauth_login" in capsys.readouterr().err
    c = load_config(tmp_path, monkeypatch, LOGIN="lti11")
    secret = (tmp_path / "run" / "lti11_secret")
    assert c.LTI11Authenticator.consumers == {"parlab": secret.read_text()}
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(SystemExit, match="PARLAB_HUB_LOGIN=saml: one of lti13, lti11"):
        load_config(tmp_path, monkeypatch, LOGIN="saml")


# --- make hub-roster as root, with the box's Unix accounts (make test-hub) --------------------

def pam_login(user: str, password: str) -> str:
    """What JupyterHub's PAMAuthenticator does with a login form (service "login")."""
    code = ("import pamela, sys\ntry:\n    pamela.authenticate(sys.argv[1], sys.argv[2], "
            "service='login')\n    pamela.check_account(sys.argv[1], service='login')\n"
            "    print('OK')\nexcept pamela.PAMError as e:\n    print('REFUSED', e)\n")
    return subprocess.run([sys.executable, "-c", code, user, password], capture_output=True,
                          text=True, timeout=30).stdout.strip()


def graded_gradebook(root: Path) -> None:
    """A gradebook with module m: plt-ben's submission graded 2 of 3 points."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.add_assignment("m")
        gb.add_notebook("m", "m")
        gb.add_grade_cell("t", "m", "m", max_score=3, cell_type="code")
        gb.add_student("plt-ben")
        sub = gb.add_submission("m", "plt-ben")
        grade = sub.notebooks[0].grades[0]
        grade.auto_score = 2
        gb.db.commit()


def score(root: Path, student: str) -> float:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return gb.find_submission("m", student).score


def hub_roster(root: Path, run: Path, names: list[str]) -> str:
    listing = write_csv(root / "class.csv", [["Username", "First name", "Surname",
                                              "Email address"],
                                             *([n, *STUDENTS[n]] for n in names)])
    proc = subprocess.run(
        ["make", "-s", "hub-roster", f"ROSTER={listing}", f"VENV={Path(sys.executable).parents[1]}",
         "PARLAB_HUB_SYSTEM_USERS=1", f"PARLAB_COURSE_ROOT={root}", f"PARLAB_HUB_RUN={run}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def passwords(run: Path) -> dict[str, str]:
    found = {}
    for path in sorted(run.glob("roster-passwords-*.txt")):
        assert oct(path.stat().st_mode & 0o777) == "0o600" and path.stat().st_uid == 0
        found.update(line.split() for line in path.read_text().splitlines()
                     if not line.startswith("#"))
    return found


def shadow(user: str) -> list[str]:
    return subprocess.run(["getent", "shadow", user], capture_output=True,
                          text=True).stdout.strip().split(":")


@HUB
def test_the_roster_as_the_box_users(tmp_path, monkeypatch):
    root, run = tmp_path / "course", tmp_path / "run"
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # alembic
    root.mkdir()
    graded_gradebook(root)
    try:
        said = hub_roster(root, run, ["plt-ann", "plt-ben", "plt-cy"])
        assert "added:     plt-ann (Ann Lee), plt-ben (Ben Okafor), plt-cy (Cy Twombly)" in said
        first = passwords(run)
        assert sorted(first) == ["plt-ann", "plt-ben", "plt-cy"], said
        for user, password in first.items():
            assert pam_login(user, password) == "OK", user
            assert pwd.getpwnam(user).pw_gecos.startswith(STUDENTS[user][0])
        subprocess.run(["chage", "-d", "0", "plt-cy"], check=True)     # expired: the hub's
        assert "new one required" in pam_login("plt-cy", first["plt-cy"])  # PAM refuses
        said = hub_roster(root, run, ["plt-ann", "plt-cy", "plt-dee"])
        assert "retired:   plt-ben (1 graded submissions kept)" in said, said
        assert "added:     plt-dee (Dee Ødegård)" in said
        assert score(root, "plt-ben") == 2.0                          # his grade is kept
        assert pam_login("plt-ben", first["plt-ben"]).startswith("REFUSED")
        assert shadow("plt-ben")[1].startswith("!") and shadow("plt-ben")[7] == "1"
        assert Path(pwd.getpwnam("plt-ben").pw_dir).is_dir()          # locked, not deleted
        gate = LoginGate(root, [], [])
        with pytest.raises(HTTPError, match="plt-ben was retired"):
            gate(None, None, {"name": "plt-ben"})
        assert gate(None, None, {"name": "plt-dee"})["name"] == "plt-dee"
        assert pam_login("plt-dee", passwords(run)["plt-dee"]) == "OK"
        said = hub_roster(root, run, ["plt-ann", "plt-ben", "plt-cy", "plt-dee"])
        assert "back:      plt-ben (Ben Okafor)" in said and "unlocked" in said, said
        assert pam_login("plt-ben", first["plt-ben"]) == "OK"         # his own password
        assert score(root, "plt-ben") == 2.0
        assert Roster.load(root).active() == ["plt-ann", "plt-ben", "plt-cy", "plt-dee"]
    finally:
        remove_accounts(list(STUDENTS))


def remove_accounts(names: list[str]) -> None:
    """The accounts the roster made, their processes and homes: gone."""
    uids = set()
    for name in names:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if proc.name.isdigit() and proc.stat().st_uid in uids:
                os.kill(int(proc.name), signal.SIGKILL)
    for name in names:
        subprocess.run(["userdel", "-r", name], capture_output=True)
