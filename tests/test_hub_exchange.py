"""nbgrader's exchange through the hub, as the box's own Unix users (`make test-hub`, as root).

The hub with PARLAB_HUB_SYSTEM_USERS=1: three learners and an instructor made by the test
(plt-alice, plt-bob, plt-carol, plt-teacher; the instructors' group plt-instructors, with
plt-teacher alone in it; all removed at the end, even on failure), PAM logins, each server as
its learner. The course root is the instructor's, in the test's /tmp folder (PARLAB_COURSE_ROOT),
given to the group by the hub. The instructor, as plt-teacher (no root), releases
00_collectives (`make hub-release`; root releases it again: sudo still works); each learner
fetches it through the Assignments tab's HTTP API (alice in Chromium, clicking Fetch), runs a
visible test in their own kernel, and submits; plt-teacher collects (`make hub-collect`),
autogrades and makes feedback (parlab.grading's CLI, as `make autograde` and `make feedback`
call it) and returns it (`make hub-return`); bob fetches his feedback, which has no hidden
test; plt-teacher's own server answers the formgrader's API with the module and the three
graded submissions. In alice's own kernel, bob's workspace, his submission and cached copy,
the inbound folder's listing, the course folder's name and the course root's solutions/,
.git/ and gradebook are out of reach (PermissionError). The GPU allotment of a fake 8 GPUs:
two learners get 4 each, the third CPU ranks. Stopping the hub leaves no process
(test_hub_e2e.running_hub checks).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from test_hub_e2e import ARTIFACTS, CHROMIUM, Hub, held, logged_in, running_hub
from unix_accounts import unix_users

from parlab.grading.base.runner import generate_release
from parlab.grading.collect.fake import fake_submission
from parlab.grading.sandbox import problem as sandbox_problem
from parlab.hub.private import HIDDEN, INSTRUCTOR_FOLDERS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1",
                       reason="the hub's end-to-end tests run with `make test-hub`"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                       reason="needs root and useradd: the test makes Unix users"),
]
MODULE, COURSE = "00_collectives", "parlab"
LEARNERS = ["plt-alice", "plt-bob", "plt-carol"]
TEACHER = "plt-teacher"
GROUP = "plt-instructors"
PASSWORD = "plt-Pass-4-hub-test"


def instructor(*args: str, env: dict[str, str], timeout: float = 300, user: str = TEACHER,
               ok: bool = True) -> str:
    """A command as the instructor (`user`, their own account and groups, as from a terminal
    of their server; "root": as root, sudo), in the repository; its output."""
    if user != "root":
        account = pwd.getpwnam(user)
        args = ("setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                "--init-groups", "--", *args)
        env = {**env, "HOME": account.pw_dir, "USER": user, "LOGNAME": user}
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    if not ok:
        return out.stdout + out.stderr if out.returncode else "SUCCEEDED"
    assert out.returncode == 0, f"{args}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out.stdout + out.stderr


def action(hub: Hub, user: str, what: str) -> dict:
    """The Assignments tab's own request (nbgrader's assignment_list server extension)."""
    reply = hub.api("POST", f"/user/{user}/assignments/{what}?course_id={COURSE}"
                    f"&assignment_id={MODULE}")
    assert reply["success"], f"{user} {what}: {reply}"
    return reply


CHECK = """
import json, os, torch, torch.distributed as dist
mine = os.path.join(os.environ["PARLAB_HUB_WORKSPACE"], "00_collectives/00_collectives.ipynb")
cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
         for c in json.load(open(mine))["cells"]}
try:
    exec(cells["ring_allreduce_answer"]); exec(cells["ring_allreduce_test"]); print("CHECK passed")
except Exception as exc:
    print("CHECK", type(exc).__name__)
"""

ATTEMPTS = """
import os
def attempt(what, fn):
    try:
        fn(); print(what, "DONE")
    except PermissionError:
        print(what, "REFUSED")
    except OSError as exc:
        print(what, type(exc).__name__)
attempt("read-workspace", lambda: open({ws!r}).read())
attempt("list-inbound", lambda: os.listdir({inbound!r}))
attempt("read-submission", lambda: open({sub!r}).read())
attempt("plant-file", lambda: open({plant!r}, "w").write("x"))
attempt("rename-submission", lambda: os.rename({subdir!r}, {subdir!r} + "-gone"))
attempt("read-cache", lambda: open({cache!r}).read())
attempt("rename-course", lambda: os.rename({course!r}, {course!r} + "-stolen"))
attempt("read-solutions", lambda: open({solutions!r}).read())
attempt("read-git", lambda: os.listdir({git!r}))
attempt("read-course-solutions", lambda: open({course_solutions!r}).read())
attempt("read-gradebook", lambda: open({gradebook!r}, "rb").read())
"""


@contextlib.contextmanager
def checkout_as_it_was() -> Iterator[None]:
    """The hub (keep_private) hides the checkout's solutions/, .git/ and autograder/valid/ and
    makes its submitted/, autograded/, feedback/ and gradebook.db: put back after."""
    modes = {ROOT / n: (ROOT / n).stat().st_mode & 0o7777 for n in HIDDEN if (ROOT / n).is_dir()}
    absent = [ROOT / n for n in (*INSTRUCTOR_FOLDERS, "gradebook.db") if not (ROOT / n).exists()]
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
        for path in absent:               # only as the hub made them: empty
            with contextlib.suppress(OSError):
                if path.is_dir():
                    path.rmdir()
                elif path.stat().st_size == 0:
                    path.unlink()


def test_the_exchange_as_the_box_users(monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="plt-hub-"))       # /tmp: the learners reach run/
    base.chmod(0o755)
    course_root = base / "course_root"     # the instructor's: the hub gives it to GROUP
    shutil.copytree(ROOT / "solutions" / MODULE, course_root / "solutions" / MODULE)
    generate_release(MODULE, root=course_root, database=True)
    monkeypatch.setenv("PARLAB_COURSE_ROOT", str(course_root))      # the hub's, too
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PARLAB_HUB_RUN": str(base / "run"), "PARLAB_HUB_INSTRUCTOR_GROUP": GROUP}
    make = ["make", "-s", f"VENV={Path(sys.executable).parents[1]}"]
    grading = [sys.executable, "-m", "parlab.grading", "--root", str(course_root)]
    steps: dict[str, float] = {}
    started = time.monotonic()
    try:
        with checkout_as_it_was(), unix_users([*LEARNERS, TEACHER], PASSWORD, GROUP,
                                              [TEACHER]), running_hub(
                base, SYSTEM_USERS="1", LEARNERS=",".join(LEARNERS), INSTRUCTORS=TEACHER,
                INSTRUCTOR_GROUP=GROUP) as hub:
            run, exchange = base / "run", base / "run" / "exchange" / COURSE
            gid = grp.getgrnam(GROUP).gr_gid
            assert oct((base / "run" / "exchange").stat().st_mode & 0o7777) == "0o1777"
            assert oct((exchange / "inbound").stat().st_mode & 0o7777) == "0o3773"
            assert (exchange / "inbound").stat().st_gid == gid
            assert (course_root / "gradebook.db").stat().st_gid == gid
            refused = instructor(*make, "hub-release", f"MODULE={MODULE}", env=env,
                                 user="plt-carol", ok=False)           # a learner cannot
            assert "not in the instructors' group" in refused, refused
            instructor(*make, "hub-release", f"MODULE={MODULE}", env=env)      # as plt-teacher
            released = exchange / "outbound" / MODULE / f"{MODULE}.ipynb"
            assert released.stat().st_uid == pwd.getpwnam(TEACHER).pw_uid
            instructor(*make, "hub-release", f"MODULE={MODULE}", env=env, user="root")
            assert released.exists()
            steps["released"] = time.monotonic() - started
            for user in LEARNERS:
                hub.api("POST", f"/hub/api/users/{user}/server")
                hub.wait_ready(user)
            assert held(hub) == {"plt-alice": [0, 1, 2, 3], "plt-bob": [4, 5, 6, 7]}
            home = {u: Path(pwd.getpwnam(u).pw_dir) / "parlab" for u in LEARNERS}
            assert oct(home["plt-bob"].stat().st_mode & 0o777) == "0o700"
            assert not any(home["plt-bob"].iterdir()), "the exchange brings the modules"
            browser_fetch(hub, "plt-alice")
            for user in LEARNERS[1:]:
                action(hub, user, "fetch")
            steps["fetched"] = time.monotonic() - started
            mine = home["plt-bob"] / MODULE / f"{MODULE}.ipynb"       # bob's full answers
            nbformat.write(fake_submission(course_root / "solutions" / MODULE / mine.name,
                                           mine), str(mine))
            os.chown(mine, pwd.getpwnam("plt-bob").pw_uid, pwd.getpwnam("plt-bob").pw_gid)
            checks = {user: hub.execute(user, CHECK) for user in LEARNERS}
            assert "CHECK passed" in checks["plt-bob"], checks
            assert "CHECK RankError" in checks["plt-alice"], checks     # the stub raises
            steps["checked"] = time.monotonic() - started
            for user in LEARNERS:
                action(hub, user, "submit")
            subs = {s.name.split("+")[0]: s for s in (exchange / "inbound").iterdir()}
            assert sorted(subs) == LEARNERS
            bob_sub = subs["plt-bob"]
            assert oct(bob_sub.stat().st_mode & 0o777) == "0o750"
            assert bob_sub.stat().st_gid == (bob_sub / mine.name).stat().st_gid == gid
            assert oct((bob_sub / mine.name).stat().st_mode & 0o777) == "0o640"
            cache = next((home["plt-bob"].parent / ".local/share/jupyter/nbgrader_cache"
                          / COURSE).iterdir()) / mine.name
            out = hub.execute("plt-alice", ATTEMPTS.format(
                ws=str(mine), inbound=str(exchange / "inbound"), subdir=str(bob_sub),
                sub=str(bob_sub / mine.name), plant=str(bob_sub / "planted.py"),
                cache=str(cache), course=str(exchange),
                solutions=str(ROOT / "solutions" / MODULE / mine.name), git=str(ROOT / ".git"),
                course_solutions=str(course_root / "solutions" / MODULE / mine.name),
                gradebook=str(course_root / "gradebook.db")))
            # (in a git worktree .git is a file naming the repository's own .git elsewhere,
            # which keep_private does not reach: serve a class from a plain clone)
            git = ["read-git"] if (ROOT / ".git").is_dir() else []
            for what in ("read-workspace", "list-inbound", "read-submission", "plant-file",
                         "rename-submission", "read-cache", "rename-course", "read-solutions",
                         *git, "read-course-solutions", "read-gradebook"):
                assert f"{what} REFUSED" in out, out
            steps["private"] = time.monotonic() - started
            instructor(*make, "hub-collect", f"MODULE={MODULE}", env=env)     # as plt-teacher
            for user in LEARNERS:
                assert (course_root / "submitted" / user / MODULE / mine.name).exists()
            # The sandbox's cgroup limits need root (or a delegated cgroup): as the teacher
            # without one, grade as UNSAFE=1 does (autograder/hub/README.md says so).
            unsafe = instructor(sys.executable, "-c", "from parlab.grading.sandbox import "
                                "problem; print(problem() or '')", env=env).strip()
            graded = instructor(*grading, "autograde", "--module", MODULE, "--workers", "3",
                                *(["--unsafe"] if unsafe or sandbox_problem() else []), env=env)
            steps["autograded"] = time.monotonic() - started
            scores = dict(re.findall(r"^(plt-\w+)\s+\S+\s+(\S+)", graded, re.M))
            got, full = scores["plt-bob"].split("/")
            assert got == full and scores["plt-alice"].startswith("0/"), graded
            instructor(*grading, "feedback", "--module", MODULE, env=env)
            instructor(*make, "hub-return", f"MODULE={MODULE}", env=env)
            browser_feedback(hub, "plt-bob")       # lands on the Assignment List; the page opens
            pages = list((home["plt-bob"] / MODULE / "feedback").rglob("*.html"))
            assert pages, "no feedback fetched"
            hidden = hidden_lines(course_root / "solutions" / MODULE / mine.name)
            assert hidden and not any(line in pages[0].read_text() for line in hidden)
            hub.api("POST", f"/hub/api/users/{TEACHER}/server")
            hub.wait_ready(TEACHER)
            assert hub.status(f"/user/{TEACHER}/formgrader") == 200
            api = f"/user/{TEACHER}/formgrader/api"
            modules = {a["name"]: a for a in hub.api("GET", f"{api}/assignments")}
            assert modules[MODULE]["num_submissions"] == len(LEARNERS), modules
            graded_subs = {s["student"]: s for s in hub.api("GET", f"{api}/submissions/{MODULE}")}
            assert sorted(graded_subs) == LEARNERS, graded_subs
            assert all(s["autograded"] for s in graded_subs.values()), graded_subs
            bob = graded_subs["plt-bob"]
            assert bob["score"] == bob["max_score"] > 0, bob
            steps["formgrader"] = time.monotonic() - started
            check_status(hub, make, env, full=full)
            steps["status"] = time.monotonic() - started
            assert run.exists()
        print("steps (s):", {k: round(v, 1) for k, v in steps.items()})
    finally:
        if (base / "hub.log").exists():
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(base / "hub.log", ARTIFACTS / "exchange-hub.log")
        shutil.rmtree(base, ignore_errors=True)


def check_status(hub: Hub, make: list[str], env: dict[str, str], full: str) -> None:
    """`make status` as plt-teacher, and the same on plt-teacher's server's status page: every
    learner fetched, submitted, was collected, graded (bob full marks, the stubs 0) and had
    their feedback returned (issue 46, item 3)."""
    table = instructor(*make, "status", f"MODULE={MODULE}", env=env)
    got = {line.split()[0]: re.split(r"\s{2,}", line) for line in table.splitlines()
           if line.startswith("plt-")}
    assert sorted(got) == LEARNERS, table
    for row in got.values():         # student, fetched, submitted, late by, collected, ...
        assert row[1].endswith(" UTC") and row[2].endswith(" UTC"), table
        assert row[4] == "yes" and row[6] == "returned", table
    assert got["plt-bob"][5] == f"{full}/{full}", table
    assert got["plt-alice"][5] == f"0/{full}", table
    assert "3 of 3 fetched, 3 submitted, 3 collected, 3 graded, 3 with feedback" in table, table
    req = urllib.request.Request(f"{hub.base}/user/{TEACHER}/parlab/status?module={MODULE}",
                                 headers={"Authorization": f"token {hub.token}"})
    with urllib.request.urlopen(req, timeout=60) as reply:
        page = reply.read().decode()
    for user in LEARNERS:
        assert f"<td>{user}</td>" in page, page
    assert page.count("<td>returned</td>") == 3 and f"<td>{full}/{full}</td>" in page, page


def browser_feedback(hub: Hub, user: str) -> None:
    """Chromium logs in as `user` without saying where to go: the hub sends them to their
    JupyterLab with nbgrader's Assignment List open (no Start My Server, no menu); Fetch
    Feedback, then "(view feedback)" opens the feedback page in a tab of its own."""
    if not Path(CHROMIUM).exists():
        action(hub, user, "fetch_feedback")
        return
    with logged_in(hub, user, PASSWORD, then="", name="feedback") as page:
        page.get_by_role("button", name="Fetch Feedback").click(timeout=60_000)
        page.get_by_text("(view feedback)").click(timeout=60_000)
        tab = page.locator(".lm-TabBar-tabLabel", has_text=f"{MODULE}.html")
        tab.wait_for(timeout=60_000)
        page.frame_locator("iframe").last.get_by_text("Score").first.wait_for(timeout=60_000)
        page.screenshot(path=ARTIFACTS / "exchange-feedback.png")


def hidden_lines(source: Path) -> list[str]:
    """The hidden tests' lines of the solution notebook (long enough to be telling)."""
    lines, inside = [], False
    for cell in nbformat.read(str(source), as_version=4).cells:
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) > 20:
                lines.append(line.strip())
    return lines


def browser_fetch(hub: Hub, user: str) -> None:
    """Chromium logs in as `user` with their Unix password (PAM), opens nbgrader's
    Assignments tab and clicks Fetch; the module lands in their workspace."""
    if not Path(CHROMIUM).exists():
        action(hub, user, "fetch")
        return
    with logged_in(hub, user, PASSWORD, then=f"/user/{user}/lab", name="exchange") as page:
        page.get_by_text("Nbgrader", exact=True).click(timeout=60_000)
        page.get_by_text("Assignment List", exact=True).click()
        page.get_by_role("button", name="Fetch").first.click(timeout=60_000)
        page.wait_for_selector("text=Downloaded assignments", timeout=60_000)
        page.screenshot(path=ARTIFACTS / "exchange-fetch.png")
    workspace = Path(pwd.getpwnam(user).pw_dir) / "parlab"
    for _ in range(60):
        if (workspace / MODULE / f"{MODULE}.ipynb").exists():
            return
        time.sleep(0.5)
    raise AssertionError(f"{user}'s Fetch in the browser brought nothing: "
                         + json.dumps(sorted(p.name for p in workspace.iterdir())))
