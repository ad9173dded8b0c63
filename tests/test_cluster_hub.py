"""`make hub` with PARLAB_HUB_SPAWNER=slurm on the test cluster (tests/cluster.py): each
learner's server a Slurm job (batchspawner behind wrapspawner's ProfilesSpawner, through
parlab.hub.slurm), as the box's own Unix users (made here, removed after).

Two learners log in in Chromium with their Unix passwords and pick a profile on the spawn
page. The first waits behind a job that holds both nodes: the page shows the queue's wait and
Slurm's reason, then her JupyterLab opens. The second picks "A whole GPU", which this cluster
(no GRES) refuses: the page says so in Slurm's words; he picks "CPU only" and his opens. Both
jobs are in `squeue` as their learners; each fetches module 00 through nbgrader's exchange
from inside the job (the environment reached it), runs a visible test on a wrong answer in a
kernel of its job (SLURM_JOB_ID, no PARLAB_GPUS; the check fails), and the first clicks
Validate, whose dialog shows the check's hint. The hub's stop cancels both jobs. A second
hub: a server whose job dies before it starts (a home the job cannot write to) is reported
with the job's state and reason, one whose job the administrator holds in the queue is
cancelled and reported, and the idle culler's stop cancels a job. `make test-cluster`, as
root, the hub from .venv-hub (a venv the learners can run: tests/cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_CLUSTER") != "1",
                       reason="the Slurm cluster's tests run with `make test-cluster`"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                       reason="needs root and useradd: the test makes Unix users"),
]
MODULE = "00_collectives"
PASSWORD = "pls-Pass-4-slurm-hub"
WRONG_RING = "def ring_allreduce(x):\n    return x.clone()  # sends nothing\n"
CHECK = """
import json, os
from parlab.launch import run
print("JOB=" + os.environ.get("SLURM_JOB_ID", "none"), "NODE=" + os.environ["SLURMD_NODENAME"])
print("GPUS=" + os.environ.get("PARLAB_GPUS", "unset"), "RANKS=" + repr(run(lambda: 1, 2)))
mine = os.path.join(os.environ["PARLAB_HUB_WORKSPACE"], "00_collectives/00_collectives.ipynb")
cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
         for c in json.load(open(mine))["cells"]}
try:
    exec(cells["ring_allreduce_answer"]); exec(cells["ring_allreduce_test"]); print("CHECK passed")
except Exception as exc:
    print("CHECK", type(exc).__name__)
"""


@pytest.fixture(scope="module")
def hub_venv():
    """The hub and the learners' servers run from .venv-hub (`make test-cluster` makes it):
    a job runs as its learner, who cannot run a venv made from a Python under /root."""
    if not (Path(sys.executable).parent / "batchspawner-singleuser").exists():
        pytest.skip("run with .venv-hub's Python, which has the [hub] extra (make test-cluster)")


@contextlib.contextmanager
def accounts(*roles: str) -> Iterator[dict[str, str]]:
    """Unix accounts for `roles` ("a", "b", "teacher"), named afresh (other sessions' hub tests
    use their own), and the instructors' group with the teacher in it."""
    from unix_accounts import unix_users

    tag = secrets.token_hex(2)
    names = {role: f"pls{tag}{role[0]}" for role in roles}
    with unix_users(list(names.values()), PASSWORD, f"pls{tag}g", [names["teacher"]]):
        names["group"] = f"pls{tag}g"
        yield names


@contextlib.contextmanager
def slurm_hub(cluster, base: Path, names: dict[str, str], **settings: str):
    """running_hub with PARLAB_HUB_SPAWNER=slurm and the test cluster's SLURM_CONF, the
    checkout as it was afterwards (the hub hides its solutions/ and .git/)."""
    from test_hub_e2e import running_hub
    from test_hub_exchange import checkout_as_it_was

    course_root = base / "course_root"            # the instructor's (made private by the hub)
    course_root.mkdir()
    learners = ",".join(v for k, v in names.items() if k not in ("teacher", "group"))
    given = {"SPAWNER": "slurm", "LEARNERS": learners, "INSTRUCTORS": names["teacher"],
             "INSTRUCTOR_GROUP": names["group"], "GPUS": "", "SLURM_CPUS": "4",
             "SLURM_MEM": "1G", "SLURM_TIME": "20", "START_S": "120", **settings}
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PARLAB_COURSE_ROOT")}
    os.environ.update(SLURM_CONF=str(cluster.conf), PARLAB_COURSE_ROOT=str(course_root))
    try:
        with checkout_as_it_was(), running_hub(base, **given) as hub:
            yield hub
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.update({key: value})
        if (base / "hub.log").exists():
            from test_hub_e2e import ARTIFACTS

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(base / "hub.log", ARTIFACTS / f"slurm-{base.name}-hub.log")


def test_the_profiles_take_their_settings(tmp_path, monkeypatch, capsys, hub_venv):
    """The configuration under SPAWNER=slurm: the profiles offered, in the order given, each
    with the partition, reservation, time, memory and cores its settings give (a profile's
    own over the common ones), and the pitfalls' settings; an unknown profile is refused."""
    from test_hub_allot import load_config
    from test_hub_exchange import checkout_as_it_was

    import parlab.hub.exchange

    monkeypatch.setattr(parlab.hub.exchange, "cannot_reach", lambda *a, **k: None)
    monkeypatch.setenv("PARLAB_COURSE_ROOT", str(tmp_path / "course_root"))
    for name in ("EXCHANGE", "COURSE_ID", "INSTRUCTOR_GROUP"):  # the configuration sets them
        monkeypatch.setenv(f"PARLAB_HUB_{name}", "")          # in os.environ: undone after
        monkeypatch.delenv(f"PARLAB_HUB_{name}")
    (tmp_path / "course_root").mkdir()
    given = {"SPAWNER": "slurm", "INSTRUCTORS": "root", "INSTRUCTOR_GROUP": "root"}
    with checkout_as_it_was():
        c = load_config(tmp_path, monkeypatch, **given, SLURM_PROFILES="gpu,cpu",
                        SLURM_PARTITION="class", SLURM_GPU_PARTITION="gpu",
                        SLURM_RESERVATION="monday", SLURM_TIME="2:00:00", SLURM_CPU_MEM="8G",
                        START_S="900")
        with pytest.raises(SystemExit, match="list some of cpu, shard, gpu"):
            load_config(tmp_path, monkeypatch, **given, SLURM_PROFILES="cpu,tpu")
    assert c.JupyterHub.spawner_class == "wrapspawner.ProfilesSpawner"
    assert [p[:2] for p in c.ProfilesSpawner.profiles] == [
        ("A whole GPU", "gpu"), ("CPU only (ranks over gloo)", "cpu")]
    gpu, cpu = (p[3] for p in c.ProfilesSpawner.profiles)
    assert (gpu["req_partition"], gpu["req_gres"], gpu["req_memory"]) == ("gpu", "gpu:1", "16G")
    assert (cpu["req_partition"], cpu["req_gres"], cpu["req_memory"]) == ("class", "", "8G")
    assert gpu["req_reservation"] == cpu["req_reservation"] == "monday"
    assert gpu["req_runtime"] == cpu["req_runtime"] == "2:00:00"
    assert gpu["req_nprocs"] == cpu["req_nprocs"] == "4"
    assert "PARLAB_ONE_GPU=0" in gpu["req_prologue"] and "ONE_GPU" not in cpu["req_prologue"]
    assert "SLURM_CONF" in c.Spawner.env_keep and c.Spawner.start_timeout == 900
    bin_ = Path(sys.executable).parent
    assert c.Spawner.cmd == [str(bin_ / "jupyterhub-singleuser")]
    assert c.SlurmJobSpawner.batchspawner_singleuser_cmd == str(bin_ / "batchspawner-singleuser")
    assert "servers: Slurm jobs, profiles gpu, cpu" in capsys.readouterr().err


def jobs(cluster) -> dict[str, tuple[str, str, str]]:
    """squeue's jobs: id -> (user, state, node)."""
    out = cluster.run("squeue", "--noheader", "--format=%i %u %T %N").stdout
    return {line.split()[0]: tuple((line.split() + [""])[1:4]) for line in out.splitlines()}


def start_in_browser(page, hub, profile: str, *, expect_text: str, timeout_s: float = 120):
    """On the spawn page: pick `profile` (its label), Start, and wait for `expect_text` on the
    page (the progress line, or the error page of a start that failed at once); its text.
    With expect_text="": wait for JupyterLab."""
    page.goto(hub.base + "/hub/spawn")
    page.select_option("select[name=profile]", label=profile)
    page.click("#spawn_form button[type=submit]")
    if expect_text:
        page.get_by_text(expect_text).first.wait_for(timeout=timeout_s * 1000)
        return " ".join(page.inner_text("body").split())
    page.wait_for_url("**/user/*/lab**", timeout=timeout_s * 1000)
    return ""


def release_and_fetch(hub, names: dict[str, str], learners: list[str], base: Path) -> None:
    """Root releases module 00 (as the course root has it) into the hub's exchange (make
    hub-release); each learner's server fetches it (the Assignments tab's request), and the
    notebook is cut to its imports and first exercise with a wrong ring all-reduce (Validate
    in seconds, with a hint)."""
    import nbformat
    from test_hub_exchange import action

    shutil.copytree(ROOT / "course" / MODULE, base / "course_root" / "course" / MODULE)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PARLAB_HUB_RUN": str(base / "run"), "PARLAB_HUB_INSTRUCTOR_GROUP": names["group"]}
    done = subprocess.run(["make", "-s", f"VENV={Path(sys.executable).parents[1]}",
                           "hub-release", f"MODULE={MODULE}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for user in learners:
        action(hub, user, "fetch")
        path = Path(pwd.getpwnam(user).pw_dir) / "parlab" / MODULE / f"{MODULE}.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]
        nb.cells[ids.index("ring_allreduce_answer")].source = WRONG_RING
        nb.cells = [c for c, gid in zip(nb.cells, ids, strict=True)
                    if "imports" in c.metadata.get("tags", []) or gid.startswith("ring_allreduce")]
        nbformat.write(nb, str(path))


def test_two_learners_servers_run_as_slurm_jobs(slurm_cluster, hub_venv):
    from playwright.sync_api import expect
    from test_hub_e2e import ARTIFACTS, logged_in

    base = Path(tempfile.mkdtemp(prefix="pls-hub-"))
    base.chmod(0o755)
    timings, started = {}, time.monotonic()
    try:
        with accounts("ann", "ben", "teacher") as names, slurm_hub(
                slurm_cluster, base, names, SLURM_PROFILES="cpu,gpu") as hub:
            ann, ben = names["ann"], names["ben"]
            # a job of root's holds both nodes for a while: ann's waits in the queue
            blocker = slurm_cluster.sbatch("--nodes=2", "--exclusive", "--output=/dev/null",
                                           "--wrap=sleep 300", cwd=slurm_cluster.tmp)
            slurm_cluster.wait(blocker, timeout=30, states=frozenset({"RUNNING"}))
            with logged_in(hub, ann, PASSWORD, then="/hub/home", name="slurm-ann",
                           url="**/hub/home") as page:
                said = start_in_browser(page, hub, "CPU only (ranks over gloo)",
                                        expect_text="waiting in the queue")
                assert "reason: Resources" in said and "up to 120 s" in said, said
                page.screenshot(path=ARTIFACTS / "slurm-ann-queue.png")
                slurm_cluster.run("scancel", str(blocker))          # the nodes free up
                page.wait_for_url(f"**/user/{ann}/lab**", timeout=120_000)
            timings["ann's server, after the queue"] = time.monotonic() - started
            with logged_in(hub, ben, PASSWORD, then="/hub/home", name="slurm-ben",
                           url="**/hub/home") as page:
                failed = start_in_browser(page, hub, "A whole GPU", expect_text="Slurm refused")
                assert "Slurm refused your server's job" in failed, failed
                assert "Invalid generic resource (gres) specification" in failed, failed
                page.screenshot(path=ARTIFACTS / "slurm-ben-refused.png")
                start_in_browser(page, hub, "CPU only (ranks over gloo)", expect_text="")
            timings["ben's server"] = time.monotonic() - started
            running = jobs(slurm_cluster)
            mine = {user: (job, node) for job, (user, state, node) in running.items()
                    if state == "RUNNING" and user in (ann, ben)}
            assert set(mine) == {ann, ben}, running
            release_and_fetch(hub, names, [ann, ben], base)
            timings["released and fetched"] = time.monotonic() - started
            for user in (ann, ben):
                out = hub.execute(user, CHECK)
                job, node = mine[user]
                assert f"JOB={job} NODE={node}" in out, out          # ran in its job
                assert "GPUS=unset RANKS=[1, 1]" in out and "CHECK CheckFailed" in out, out
            timings["a test cell in each job"] = time.monotonic() - started
            with logged_in(hub, ann, PASSWORD, name="slurm-ann-validate",
                           then=f"/user/{ann}/lab/tree/{MODULE}/{MODULE}.ipynb") as page:
                button = page.locator(".validate-button")
                expect(button).to_be_visible(timeout=120_000)
                button.click()
                dialog = page.locator(".jp-Dialog")
                expect(dialog).to_be_visible(timeout=180_000)
                text = " ".join(dialog.inner_text().split())
                page.screenshot(path=ARTIFACTS / "slurm-ann-validate.png")
                assert "Likely mistake: send chunks to your right neighbour" in text, text
            timings["Validate"] = time.monotonic() - started
        assert not {j for j, (u, _, _) in jobs(slurm_cluster).items() if u in (ann, ben)}, \
            f"the hub's stop left its jobs: {jobs(slurm_cluster)}"
        print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    finally:
        slurm_cluster.cancel_all()
        shutil.rmtree(base, ignore_errors=True)


def start_said(hub, user: str, options: dict[str, str], timeout: float = 120) -> str:
    """Start `user`'s server with `options`; what the learner reads at the end: the error of
    a start that failed at once, else the last progress message (ready or failed)."""
    try:
        hub.api("POST", f"/hub/api/users/{user}/server", options)
    except urllib.error.HTTPError as err:
        return str(json.loads(err.read()).get("message"))
    req = urllib.request.Request(hub.base + f"/hub/api/users/{user}/server/progress",
                                 headers={"Authorization": f"token {hub.token}"})
    said = ""
    with urllib.request.urlopen(req, timeout=timeout) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                said = event.get("message", "")
                if event.get("ready") or event.get("failed"):
                    break
    return said


def hold_when_queued(cluster, user: str, timeout: float = 30) -> None:
    """`scontrol hold` (as root: JobHeldAdmin) `user`'s job once it is in the queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job, (owner, state, _) in jobs(cluster).items():
            if owner == user and state == "PENDING":
                cluster.run("scontrol", "hold", job)
                return
        time.sleep(0.3)


def test_a_dead_or_held_job_is_reported_and_the_culler_cancels_a_job(slurm_cluster, hub_venv):
    base = Path(tempfile.mkdtemp(prefix="pls-hub-"))
    base.chmod(0o755)
    try:
        with accounts("cay", "teacher") as names, slurm_hub(
                slurm_cluster, base, names, SLURM_PROFILES="cpu", IDLE_S="10") as hub:
            cay = names["cay"]
            # each job posts its server's port here: `import batchspawner` in the
            # configuration registers it (POST only); without it, 404 and a start that spins
            assert hub.status("/hub/api/batchspawner") == 405
            home = Path(pwd.getpwnam(cay).pw_dir)
            home.chmod(0o555)            # the job cannot write its log: it fails at once
            said = start_said(hub, cay, {"profile": "cpu"})
            assert "ended before your server started: FAILED, reason JobLaunchFailure" in said, \
                said
            home.chmod(0o755)
            # a job held by the administrator waits for what no wait brings: cancelled, said
            blocker = slurm_cluster.sbatch("--nodes=2", "--exclusive", "--output=/dev/null",
                                           "--wrap=sleep 300", cwd=slurm_cluster.tmp)
            slurm_cluster.wait(blocker, timeout=30, states=frozenset({"RUNNING"}))
            holder = threading.Thread(target=hold_when_queued, args=(slurm_cluster, cay))
            holder.start()
            said = start_said(hub, cay, {"profile": "cpu"})
            holder.join()
            assert "it waits for JobHeldAdmin, which no wait resolves" in said, said
            assert not [j for j, (u, _, _) in jobs(slurm_cluster).items() if u == cay]
            slurm_cluster.run("scancel", str(blocker))
            hub.api("POST", f"/hub/api/users/{cay}/server", {"profile": "cpu"})
            hub.wait_ready(cay)
            job = next(j for j, (u, state, _) in jobs(slurm_cluster).items()
                       if u == cay and state == "RUNNING")
            deadline = time.monotonic() + 90
            while hub.api("GET", f"/hub/api/users/{cay}")["servers"] and \
                    time.monotonic() < deadline:
                time.sleep(1)
            assert not hub.api("GET", f"/hub/api/users/{cay}")["servers"], "not culled in 90 s"
            fields = slurm_cluster.wait(int(job), timeout=30)
            assert fields["JobState"] == "CANCELLED", fields
    finally:
        slurm_cluster.cancel_all()
        shutil.rmtree(base, ignore_errors=True)
