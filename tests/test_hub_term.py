"""An instructor's term on the hub's exchange, as the box's own Unix users, without servers
(`make test-hub`, as root; about 45 s).

The test makes what the hub makes when it starts (the exchange, root's, given to the instructors'
group; the course root kept private, its gradebook empty) and Unix accounts (plta-ann,
plta-ben, plta-cy, the instructor plta-teacher and the group plta-instructors; removed at the
end, whatever happens). Learners fetch and submit with nbgrader's own commands as their
accounts, with the configuration their servers read. The instructor's commands run as
plta-teacher in each way an instructor reaches the box, with a PATH that lacks the venv; each
collect starts from a gradebook as the hub leaves it (empty: nbgrader starts `alembic` by name
to make it):
- `make hub-release` from a login shell (`su - plta-teacher`: /etc/profile's PATH);
- `make hub-collect` through `runuser -u plta-teacher -- make ...` from root's environment with
  root's PATH (a folder of root's first, holding an `alembic` the teacher cannot run, as
  pyenv's shims under /root were: `Permission denied: 'alembic'`);
- `make hub-collect` and `make status` as over ssh (what sshd gives a command: `env -i` with
  HOME, USER, LOGNAME, SHELL and PATH=/usr/local/bin:/usr/bin:/bin:/usr/games, the account's
  groups; no sshd here);
- `make hub-collect` through `sudo -u plta-teacher make ...` where sudo is installed.
Then:
- a collect that fails part-way (plta-ben's submission holds a file the instructor cannot read)
  says which submission and why, exits non-zero, collects plta-ann all the same and leaves
  nothing of plta-ben's in submitted/; the next collect, once the file is readable, takes it;
- the notebook JupyterLab keeps in .ipynb_checkpoints/ is neither submitted nor listed as an
  EXTRA notebook;
- `make status` lists the roster (the gradebook's students, with plta-dan who has no account,
  and PARLAB_HUB_LEARNERS): who fetched (a record another learner forges for plta-dan is not
  believed), who submitted when, late by how much against the gradebook's due date, collected;
- `make hub-teardown` asks first (answered "no": nothing removed), then with YES=1 archives the
  gradebook, the class list and the status, removes the learners' accounts (plta-cy known from
  the class list alone, retired there), homes, workspaces, processes, their files in /tmp and
  /dev/shm, the class list's one-time passwords and the course's exchange folder, and keeps the
  instructor and the name without an account.
"""

from __future__ import annotations

import datetime as dt
import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT
from unix_accounts import unix_users

from parlab.hub.exchange import prepare_exchange
from parlab.hub.private import keep_private
from parlab.hub.roster import Roster, Student

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1",
                       reason="the hub's tests run with `make test-hub`"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                       reason="needs root and useradd: the test makes Unix users"),
]
MODULE, COURSE = "00_collectives", "parlab"
ANN, BEN, CY, DAN = "plta-ann", "plta-ben", "plta-cy", "plta-dan"   # dan: roster only
TEACHER, GROUP = "plta-teacher", "plta-instructors"
VENV = Path(sys.executable).parents[1]
SSH_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"      # OpenSSH's default for a command


def roots_path(base: Path) -> str:
    """Root's PATH as the issue met it: first a folder of root's the instructor cannot enter,
    holding an `alembic` (pyenv's shims under /root), then the system's; never the venv."""
    shims = base / "root-shims"
    shims.mkdir(mode=0o700, exist_ok=True)
    (shims / "alembic").write_text("#!/bin/sh\nexit 3\n")
    (shims / "alembic").chmod(0o755)
    return ":".join([str(shims), *(p for p in os.environ["PATH"].split(":")
                                   if p and not p.startswith(str(VENV)))])


def as_teacher(how: str, *make_args: str, settings: dict[str, str],
               base: Path) -> subprocess.CompletedProcess:
    """`make -s VENV=<the hub's venv> <make_args> <settings>` in the repository as the
    instructor, reached `how` (the module docstring), with nothing of the test's environment."""
    make = ["make", "-s", f"VENV={VENV}", *make_args, *(f"{k}={v}" for k, v in settings.items())]
    line = f"cd {ROOT} && " + " ".join(f"'{a}'" for a in make)
    account = pwd.getpwnam(TEACHER)
    if how == "runuser":                 # as the issue ran it: root's environment and PATH
        args, env = ["runuser", "-u", TEACHER, "--", *make], {**os.environ,
                                                               "PATH": roots_path(base)}
    elif how == "sudo":
        args, env = ["sudo", "-u", TEACHER, *make], {**os.environ, "PATH": roots_path(base)}
    elif how == "login":
        args, env = ["su", "-", TEACHER, "-c", line], {"PATH": "/usr/bin:/bin"}
    elif how == "ssh":
        args = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                "--init-groups", "env", "-i", f"HOME={account.pw_dir}", f"USER={TEACHER}",
                f"LOGNAME={TEACHER}", "SHELL=/bin/bash", f"PATH={SSH_PATH}",
                "/bin/bash", "-c", line]
        env = {}
    else:
        raise ValueError(how)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def as_learner(user: str, workspace: Path, *args: str) -> subprocess.Popen:
    """nbgrader `args` as the learner, in their workspace, with their server's configuration."""
    account = pwd.getpwnam(user)
    env = {"HOME": account.pw_dir, "USER": user, "PATH": f"{VENV}/bin:/usr/bin:/bin",
           "JUPYTER_CONFIG_PATH": f"{ROOT}/autograder/hub/nbgrader:{ROOT}",
           "PARLAB_HUB_EXCHANGE": os.environ["PARLAB_HUB_EXCHANGE"],
           "PARLAB_HUB_WORKSPACE": str(workspace)}
    return subprocess.Popen(["setpriv", f"--reuid={account.pw_uid}",
                             f"--regid={account.pw_gid}", "--init-groups",
                             f"{VENV}/bin/nbgrader", *args], cwd=workspace, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def done(*procs: subprocess.Popen) -> list[str]:
    outs = []
    for proc in procs:
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out
        outs.append(out)
    return outs


def empty_gradebook(course_root: Path) -> None:
    """The gradebook as the hub leaves it before the first collect (keep_private): empty."""
    with open(course_root / "gradebook.db", "w"):
        pass


def inbound(exchange: Path, user: str) -> Path:
    [found] = [p for p in (exchange / "inbound").iterdir() if p.name.startswith(user + "+")]
    return found


def rows(table: str) -> dict[str, list[str]]:
    """`make status`'s cells (two spaces or more apart) by student."""
    return {line.split()[0]: re.split(r"\s{2,}", line) for line in table.splitlines()
            if line.startswith("plta-")}


def test_an_instructors_term_without_servers(monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="plta-"))
    base.chmod(0o755)
    course_root, run = base / "course_root", base / "run"
    shutil.copytree(ROOT / "course" / MODULE, course_root / "course" / MODULE)
    exchange = run / "exchange" / COURSE
    monkeypatch.setenv("PARLAB_HUB_EXCHANGE", str(run / "exchange"))
    settings = {"PARLAB_HUB_RUN": str(run), "PARLAB_HUB_INSTRUCTOR_GROUP": GROUP,
                "PARLAB_COURSE_ROOT": str(course_root)}
    steps: dict[str, float] = {}
    started = time.monotonic()
    try:
        with unix_users([ANN, BEN, CY, TEACHER], "plta-Pass-4-term", GROUP, [TEACHER]):
            gid = grp.getgrnam(GROUP).gr_gid
            keep_private(course_root, group=gid)                 # as the hub, when it starts
            prepare_exchange(run / "exchange", COURSE, GROUP)
            assert (course_root / "gradebook.db").stat().st_size == 0
            out = as_teacher("login", "hub-release", f"MODULE={MODULE}", settings=settings,
                             base=base)
            assert out.returncode == 0, out.stdout + out.stderr
            homes = {u: Path(pwd.getpwnam(u).pw_dir) / "parlab" for u in (ANN, BEN, CY)}
            for user, home in homes.items():
                home.mkdir()
                shutil.chown(home, user, user)
            done(*(as_learner(u, homes[u], "fetch_assignment", MODULE) for u in homes))
            steps["released, fetched"] = time.monotonic() - started
            # JupyterLab's autosave copy of the notebook: never handed in
            kept = homes[ANN] / MODULE / ".ipynb_checkpoints"
            kept.mkdir()
            shutil.copy(homes[ANN] / MODULE / f"{MODULE}.ipynb",
                        kept / f"{MODULE}-checkpoint.ipynb")
            shutil.chown(kept, ANN, ANN)
            shutil.chown(kept / f"{MODULE}-checkpoint.ipynb", ANN, ANN)
            [said] = done(as_learner(ANN, homes[ANN], "submit", MODULE))
            assert "EXTRA" not in said and "checkpoint" not in said, said
            assert not list(inbound(exchange, ANN).rglob("*checkpoint*"))
            time.sleep(2.0)               # ben hands in 2 s after ann, past the due date
            done(as_learner(BEN, homes[BEN], "submit", MODULE))
            steps["submitted"] = time.monotonic() - started
            # a file of ben's submission the instructors' group cannot read: the collect fails
            # on it, part-way (as a copy cut short by a full disk or a killed process would)
            unreadable = inbound(exchange, BEN) / "notes.txt"
            unreadable.write_text("mine")
            shutil.chown(unreadable, BEN, GROUP)
            unreadable.chmod(0o600)
            collect = ("hub-collect", f"MODULE={MODULE}")
            out = as_teacher("runuser", *collect, settings=settings, base=base)
            said = out.stdout + out.stderr
            assert "alembic" not in said, said
            assert out.returncode != 0, said
            assert f"NOT COLLECTED {BEN}" in said and "notes.txt" in said, said
            assert "not collected" in said, said
            submitted = course_root / "submitted"
            assert (submitted / ANN / MODULE / f"{MODULE}.ipynb").exists(), said
            assert not (submitted / BEN / MODULE).exists(), "a part of ben's submission stays"
            assert not [p for p in (submitted / BEN).iterdir()], "a staging folder stays"
            unreadable.chmod(0o640)                              # the learner submits again
            empty_gradebook(course_root)
            out = as_teacher("ssh", *collect, settings=settings, base=base)
            said = out.stdout + out.stderr
            assert out.returncode == 0, said
            assert f"No newer submission to collect: {ANN}" in said, said
            ours = submitted / BEN / MODULE / f"{MODULE}.ipynb"
            assert ours.read_bytes() == (inbound(exchange, BEN) / ours.name).read_bytes()
            if shutil.which("sudo"):
                empty_gradebook(course_root)
                out = as_teacher("sudo", *collect, settings=settings, base=base)
                assert out.returncode == 0, out.stdout + out.stderr
            steps["collected"] = time.monotonic() - started
            check_status(base, course_root, exchange, settings)
            steps["status"] = time.monotonic() - started
            check_teardown(base, course_root, exchange, settings, homes)
            steps["teardown"] = time.monotonic() - started
        print("steps (s):", {k: round(v, 1) for k, v in steps.items()})
    finally:
        shutil.rmtree(base, ignore_errors=True)


def submitted_at(folder: Path) -> dt.datetime:
    """The hand-in time nbgrader wrote in the submission (naive UTC)."""
    text = (folder / "timestamp.txt").read_text().strip()
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f %Z")


def check_status(base: Path, course_root: Path, exchange: Path,
                 settings: dict[str, str]) -> None:
    """The roster's rows: fetched, submitted, late by, collected, from the records."""
    from nbgrader.api import Gradebook

    ann_at, ben_at = submitted_at(inbound(exchange, ANN)), submitted_at(inbound(exchange, BEN))
    due = ann_at + dt.timedelta(milliseconds=1)           # ann on time, ben late
    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gb:   # as `nbgrader db`
        gb.update_or_create_assignment(MODULE, duedate=due)
        gb.add_student(DAN)
    forged = exchange / "fetched" / f"{DAN}+{MODULE}+forged"      # made by ann, named for dan
    forged.touch()
    shutil.chown(forged, ANN, ANN)
    out = as_teacher("ssh", "status", f"MODULE={MODULE}", base=base,
                     settings={**settings, "PARLAB_HUB_LEARNERS": f"{ANN},{BEN},{CY}"})
    table = out.stdout + out.stderr
    print(table)
    assert out.returncode == 0, table
    got = rows(table)
    assert sorted(got) == [ANN, BEN, CY, DAN], table
    minute = "%Y-%m-%d %H:%M UTC"
    late_s = int((ben_at - due).total_seconds())
    assert 0 < late_s < 60, (ann_at, ben_at)
    # student, fetched, submitted, late by, collected, graded, feedback
    assert got[ANN][2:5] == [ann_at.strftime(minute), "on time", "yes"], table
    assert got[BEN][2:5] == [ben_at.strftime(minute), f"{late_s} s", "yes"], table
    for user in (ANN, BEN, CY):
        assert got[user][1].endswith(" UTC"), table                # fetched
    assert got[CY][2:] == ["-"] * 5, table                         # nothing more
    assert got[DAN][1:] == ["-"] * 6, table            # roster only: the forgery not believed
    assert f"due {due.strftime(minute)}" in table, table
    assert "3 of 4 fetched, 2 submitted (1 late), 2 collected, 0 graded" in table, table


def check_teardown(base: Path, course_root: Path, exchange: Path, settings: dict[str, str],
                   homes: dict[str, Path]) -> None:
    """Asked first; then archived, and everything of the learners' gone but the kept names."""
    learners = {u: pwd.getpwnam(u).pw_uid for u in (ANN, BEN, CY)}
    theirs = []
    for user, uid in learners.items():  # what kernels leave (parlab.launch.scratch, Python)
        for path in (Path(tempfile.gettempdir()) / f"parlab-scratch-{uid}",
                     Path("/dev/shm") / f"plta-torch-{uid}"):
            path.mkdir(exist_ok=True)     # a killed run of this test leaves them
            shutil.chown(path, user, user)
            theirs.append(path)
    class_list = Roster.load(course_root)          # as `make hub-roster` leaves it: cy retired
    class_list.students = {u: Student(u) for u in (ANN, BEN)}
    class_list.students[CY] = Student(CY, status="retired", since="2026-12-01T00:00:00+00:00")
    class_list.save()
    passwords = base / "run" / "roster-passwords-20261201-0000.txt"
    passwords.write_text(f"{CY} one-time\n")
    ann = learners[ANN]
    sleeper = subprocess.Popen(["setpriv", f"--reuid={ann}", f"--regid={ann}", "--clear-groups",
                                "sleep", "600"])
    teardown = {**settings, "PARLAB_HUB_SYSTEM_USERS": "1", "PARLAB_HUB_INSTRUCTORS": TEACHER,
                "PARLAB_HUB_LEARNERS": f"{ANN},{BEN},{TEACHER},root",     # cy: the list's
                "PARLAB_HUB_EXCHANGE": str(exchange.parent)}
    make = ["make", "-s", f"VENV={VENV}", "hub-teardown",
            *(f"{k}={v}" for k, v in teardown.items())]
    try:
        out = subprocess.run(make, cwd=ROOT, input="no\n", capture_output=True, text=True,
                             timeout=120)
        said = out.stdout + out.stderr
        assert out.returncode != 0 and "nothing done" in said, said
        for user in (ANN, BEN, CY):
            assert f"remove the account {user}" in said, said
        assert f"keep {TEACHER}: an instructor" in said and "keep root:" in said, said
        assert f"keep {DAN}: no Unix account" in said, said
        assert f"remove {passwords} (the class list's one-time passwords)" in said, said
        assert all(p.exists() for p in theirs) and exchange.exists() and sleeper.poll() is None
        assert passwords.exists()
        assert not list(course_root.glob("parlab-term-*"))
        out = subprocess.run([*make, "YES=1"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
        said = out.stdout + out.stderr
        print(said)
        assert out.returncode == 0, said
        sleeper.wait(timeout=10)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    for user in (ANN, BEN, CY):
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
        assert not homes[user].parent.exists(), f"{user}'s home stays"
    assert pwd.getpwnam(TEACHER) and not exchange.exists(), said
    assert not [p for p in theirs if p.exists()] and not passwords.exists(), said
    left = [p for top in (Path(tempfile.gettempdir()), Path("/dev/shm")) for p in top.iterdir()
            if p.lstat().st_uid in learners.values()]
    assert not left, left
    [archive] = course_root.glob("parlab-term-parlab-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        status = tar.extractfile("status.txt").read().decode()
    assert {"gradebook.db", "status.txt", "roster.json"} <= set(names), names
    assert ANN in status and DAN in status and f"{CY} (retired)" in status, status
    assert oct(archive.stat().st_mode & 0o777) == "0o640"


def test_status_of_a_class_without_the_hub(tmp_path, monkeypatch):
    """`make status` for a class that hands in through `make collect` (no exchange): the
    gradebook's roster with one who never handed in, and the class list's (`make hub-roster`)
    with one only there and one retired; submission times from the learning platform's CSV,
    late by against the gradebook's due date."""
    from nbgrader.api import Gradebook

    root, inbox = tmp_path / "root", tmp_path / "inbox"
    shutil.copytree(ROOT / "course" / MODULE, root / "course" / MODULE)
    for user in ("ann", "ben"):
        (inbox / user).mkdir(parents=True)
        shutil.copy(ROOT / "course" / MODULE / f"{MODULE}.ipynb", inbox / user)
    due = dt.datetime(2026, 3, 1, 17, 0)
    (tmp_path / "times.csv").write_text("student,module,timestamp\n"
                                        f"ann,{MODULE},2026-03-01 16:00:00\n"
                                        f"ben,{MODULE},2026-03-01 19:30:00\n")
    env = {**os.environ, "PATH": f"{VENV}/bin:{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root), "collect",
                    str(inbox), "--times", str(tmp_path / "times.csv")], env=env, check=True,
                   capture_output=True)
    monkeypatch.setenv("PATH", env["PATH"])           # nbgrader makes the gradebook: alembic
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.update_or_create_assignment(MODULE, duedate=due)
        for user in ("ann", "ben", "cy"):
            gb.add_student(user)
    class_list = Roster.load(root)
    class_list.students = {u: Student(u) for u in ("ann", "ben", "eve")}
    class_list.students["dee"] = Student("dee", status="retired", since="2026-02-01T00:00:00")
    class_list.save()
    out = subprocess.run(["make", "-s", f"VENV={VENV}", "status", f"MODULE={MODULE}",
                          f"PARLAB_COURSE_ROOT={root}", f"PARLAB_HUB_RUN={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    table = out.stdout + out.stderr
    assert out.returncode == 0, table
    got = {line.split()[0]: re.split(r"\s{2,}", line) for line in table.splitlines()
           if line.split() and line.split()[0] in ("ann", "ben", "cy", "dee", "eve")}
    # student, submitted, late by, collected, graded, feedback (no fetched: no exchange)
    assert got["ann"][1:4] == ["2026-03-01 16:00 UTC", "on time", "yes"], table
    assert got["ben"][1:4] == ["2026-03-01 19:30 UTC", "2 h 30 min", "yes"], table
    assert got["cy"][1:] == got["eve"][1:] == got["dee"][1:] == ["-"] * 5, table
    assert got["dee"][0] == "dee (retired)" and got["eve"][0] == "eve", table
    assert "no exchange" in table and "due 2026-03-01 17:00 UTC" in table, table
