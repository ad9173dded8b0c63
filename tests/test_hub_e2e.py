"""`make hub` for real on this machine: JupyterHub with autograder/hub/jupyterhub_config.py,
three local learners and an instructor, driven through the hub's REST API (no browser).

About a minute on 2 cores, so not part of `make test`: `make test-hub` installs the [hub]
extra and runs it (PARLAB_TEST_HUB=1). A fake plan of 8 GPUs, 4 per learner: alice and bob
get GPUs, carol CPU ranks and the line saying so; each runs 2 ranks in their own kernel, in
their own workspace, with the learner's Jupyter configuration; stopping a server returns its
GPUs; stopping the hub leaves no process of it behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1",
                       reason="the hub's end-to-end test runs with `make test-hub`"),
]
BIN = Path(sys.executable).parent
LEARNERS = ["alice", "bob", "carol"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = ROOT / "artifacts" / "hub"

WRAPPER = """
c = get_config()
load_subconfig({config!r})
c.JupyterHub.services.append({{"name": "e2e", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "e2e", "services": ["e2e"], "scopes": [
    "admin:users", "admin:servers", "access:servers", "list:users", "read:users"]}})
"""


def free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 free (the hub, its API, the proxy's API), below the
    ephemeral range, where a client connection could take one between the look and the use."""
    for _ in range(200):
        base = random.randrange(20000, 30000)
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Hub:
    def __init__(self, base: str, token: str, run: Path) -> None:
        self.base, self.token, self.run = base, token, run

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, method=method, data=data,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as reply:
            text = reply.read()
        return json.loads(text) if text else None

    def status(self, path: str) -> int:
        """The HTTP status of GET `path` (through the proxy, with the token)."""
        req = urllib.request.Request(self.base + path,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as reply:
                return reply.status
        except urllib.error.HTTPError as err:
            return err.code

    def wait_ready(self, user: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.api("GET", f"/hub/api/users/{user}")["servers"].get("")
            if server and server["ready"]:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{user}'s server did not start in {timeout} s")

    def execute(self, user: str, code: str) -> str:
        """Run `code` in a new kernel of `user`'s server; its stdout, stderr and errors."""
        kernel = self.api("POST", f"/user/{user}/api/kernels", {"name": "python3"})["id"]
        try:
            return asyncio.run(self._execute(user, kernel, code))
        finally:
            self.api("DELETE", f"/user/{user}/api/kernels/{kernel}")

    async def _execute(self, user: str, kernel: str, code: str) -> str:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = self.base.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={
            "Authorization": f"token {self.token}"}))
        mid = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": mid, "msg_type": "execute_request", "username": "e2e",
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False}}))
        out = []
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 120))
            if msg.get("parent_header", {}).get("msg_id") != mid:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                ws.close()
                return "".join(out)


def processes_of(run: Path) -> list[str]:
    """Every live process whose command line or environment names the hub's folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            if str(run).encode() in seen and (proc / "stat").read_text().split()[2] != "Z":
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


RUN_TWO = """
import os
from parlab.launch import run
print("GPUS=" + os.environ["PARLAB_GPUS"], "CWD=" + os.getcwd())
print("CONFIG=" + os.environ["JUPYTER_CONFIG_PATH"])
print("RANKS=" + repr(run(lambda: 1, 2)))
from jupyter_core.paths import jupyter_config_path   # as nbgrader's Validate handler reads it
from nbgrader.apps import NbGrader
app = NbGrader()
app.config_file_paths.append([os.getcwd(), *jupyter_config_path()])
app.load_config_file()
print("VALIDATE_TIMEOUT=" + str(app.config.Execute.timeout))
"""


@contextlib.contextmanager
def running_hub(tmp: Path, **settings: str) -> Iterator[Hub]:
    """The hub on `tmp` with three learners and an instructor, a fake plan of 8 GPUs, 4 per
    learner (PARLAB_HUB_<name> settings override); when done: stopped, no process of it
    left, and every GPU back in the pool."""
    run, token, port = tmp / "run", secrets.token_hex(16), free_ports(3)
    wrapper = tmp / "jupyterhub_config.py"
    config = ROOT / "autograder" / "hub" / "jupyterhub_config.py"
    wrapper.write_text(WRAPPER.format(config=str(config), token=token))
    given = {"RUN": str(run), "PORT": str(port), "GPUS": "0,1,2,3,4,5,6,7",
             "PER_LEARNER": "4", "LEARNERS": ",".join(LEARNERS), **settings}
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           **{f"PARLAB_HUB_{k}": v for k, v in given.items()}}
    log = open(tmp / "hub.log", "w")
    started = time.monotonic()
    hub_proc = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(wrapper)], cwd=tmp,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}", token, run)
    try:
        for _ in range(120):
            if hub_proc.poll() is not None:
                raise RuntimeError("the hub exited: " + (tmp / "hub.log").read_text()[-3000:])
            try:
                hub.api("GET", "/hub/api/")
                break
            except OSError:
                time.sleep(0.5)
        print(f"\nhub up in {time.monotonic() - started:.1f} s")
        yield hub
    finally:
        hub_proc.send_signal(signal.SIGTERM)
        try:
            hub_proc.wait(timeout=60)
        finally:
            log.close()
            if hub_proc.poll() is None:
                os.killpg(hub_proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while (left := processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for line in left:                   # ours (they name our folder): end them, then fail
        with contextlib.suppress(OSError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert not left, f"left running after the hub stopped: {left}"
    if given.get("SPAWNER") != "slurm":        # under Slurm, Slurm allots the GPUs
        assert held(hub) == {}, "the hub stopped servers without returning their GPUs"


@contextlib.contextmanager
def logged_in(hub: Hub, user: str, password: str, *, then: str, name: str,
              url: str | None = None) -> Iterator[Any]:
    """A Chromium page logged in to the hub as `user` (the hub's login form), sent on to
    `then`, and waiting on their JupyterLab (or on `url`, a glob); artifacts/hub/<name>-
    failure.png if what runs with it fails."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        try:
            page.goto(hub.base + f"/hub/login?next={then}")
            page.fill("#username_input", user)
            page.fill("#password_input", password)
            page.click("#login_submit")
            page.wait_for_url(url or f"**/user/{user}/lab**", timeout=120_000)
            yield page
        except Exception:
            page.screenshot(path=ARTIFACTS / f"{name}-failure.png")
            raise
        finally:
            browser.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as started:
        yield started


def held(hub: Hub) -> dict[str, list[int]]:
    return json.loads((hub.run / "gpus.json").read_text())["held"]


def test_a_class_on_the_hub(hub):
    run, started, timings = hub.run, time.monotonic(), {}
    for user in LEARNERS:           # one after the other: the order fixes who gets GPUs
        hub.api("POST", f"/hub/api/users/{user}/server")
        hub.wait_ready(user)
    timings["3 servers up"] = time.monotonic() - started
    assert held(hub) == {"alice": [0, 1, 2, 3], "bob": [4, 5, 6, 7]}
    outs = {user: hub.execute(user, RUN_TWO) for user in ("alice", "carol")}
    timings["2 kernels ran 2 ranks"] = time.monotonic() - started
    assert "GPUS=0,1,2,3" in outs["alice"] and "RANKS=[1, 1]" in outs["alice"], outs
    assert f"CWD={run / 'users' / 'alice'}" in outs["alice"]
    assert "autograder/jupyter/learner" in outs["alice"]
    assert "VALIDATE_TIMEOUT=60" in outs["alice"], outs        # the course's, not 30
    assert "GPUS=" in outs["carol"] and "RANKS=[1, 1]" in outs["carol"], outs
    assert "your ranks run on the CPU over gloo" in outs["carol"], outs
    assert (run / "users" / "carol" / "00_collectives" / "00_collectives.ipynb").exists()
    # the learner's server: Validate, no formgrader; the instructor's: the formgrader
    assert hub.status("/user/alice/nbgrader_version?version=0") != 404
    assert hub.status("/user/alice/formgrader") == 404
    hub.api("POST", "/hub/api/users/instructor/server")
    hub.wait_ready("instructor")
    assert hub.status("/user/instructor/formgrader") == 200
    timings["instructor's formgrader"] = time.monotonic() - started
    hub.api("DELETE", "/hub/api/users/instructor/server")
    hub.api("DELETE", "/hub/api/users/alice/server")
    assert held(hub) == {"bob": [4, 5, 6, 7]}                       # alice's are back
    hub.api("DELETE", "/hub/api/users/bob/server")
    assert held(hub) == {}             # carol's server runs on: the hub's stop must end it
    print("timings (s):", {k: round(v, 1) for k, v in timings.items()})


def test_a_learner_in_a_browser(hub):
    """Chromium logs in as alice with the learners' password, the hub starts her server
    (with GPUs again), and her JupyterLab opens a notebook with nbgrader's Validate button;
    her server is left running for the hub's stop to end."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM} (`make browser` installs Debian's)")
    from playwright.sync_api import expect

    password = dict(line.split(" ", 1) for line in
                    (hub.run / "passwords").read_text().splitlines())["learners"]
    with logged_in(hub, "alice", password, then="/hub/spawn", name="alice") as page:
        page.goto(hub.base + "/user/alice/lab/tree/00_collectives/00_collectives.ipynb")
        expect(page.get_by_role("button", name="Python 3 (ipykernel) | Idle")
               ).to_be_visible(timeout=120_000)
        expect(page.get_by_role("button", name="Validate")).to_be_visible(timeout=60_000)
        assert page.get_by_text("Formgrader").count() == 0
        page.screenshot(path=ARTIFACTS / "alice-lab.png")
    assert held(hub) == {"alice": [0, 1, 2, 3]}


def test_an_idle_server_is_culled_and_its_gpus_go_back(tmp_path):
    """jupyterhub-idle-culler, as the configuration starts it, stops a server idle for
    PARLAB_HUB_IDLE_S seconds (here 10; it looks every 5) and the GPUs return to the pool."""
    with running_hub(tmp_path, IDLE_S="10") as hub:
        hub.api("POST", "/hub/api/users/bob/server")
        hub.wait_ready("bob")
        assert held(hub) == {"bob": [0, 1, 2, 3]}
        deadline = time.monotonic() + 90
        while hub.api("GET", "/hub/api/users/bob")["servers"] and time.monotonic() < deadline:
            time.sleep(1)
        assert not hub.api("GET", "/hub/api/users/bob")["servers"], "not culled in 90 s"
        assert held(hub) == {}


def test_make_hub_serves_the_class_as_the_readme_says(tmp_path):
    """The README's command itself, `make hub` with PARLAB_HUB_ settings given to make: it
    prints where to log in and the passwords, answers there (writing nothing into the
    repository: the proxy's pid file is in its run folder), and Ctrl-C (SIGINT to its
    process group, as a terminal sends it) leaves no process behind."""
    port, run = free_ports(3), tmp_path / "run"
    venv = os.path.relpath(BIN.parent, ROOT)
    proc = subprocess.Popen(["make", "-s", "hub", f"VENV={venv}", f"PARLAB_HUB_RUN={run}",
                             f"PARLAB_HUB_PORT={port}", "PARLAB_HUB_GPUS=0,1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    base, said = f"http://127.0.0.1:{port}", ""
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(base + "/hub/login", timeout=5) as page:
                    assert page.status == 200 and b"password" in page.read().lower()
                    # the proxy's pid file is in the hub's run folder, not the repository
                    assert (run / "jupyterhub-proxy.pid").is_file()
                    assert not (ROOT / "jupyterhub-proxy.pid").exists()
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"`make hub` did not answer at {base}")
    finally:
        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            said = proc.communicate(timeout=60)[0]
        stopped = time.monotonic() - stopping
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            said = proc.communicate()[0]
    assert f"open {base}" in said and "learners (alice, bob, carol): password" in said, said
    assert "GPUs: [0, 1], 2 per server" in said, said
    # it says what it stops, and stops in seconds (parlab.hub.service; 10 s: a loaded machine)
    for service in ("idle-culler", "gpu-pool"):
        assert f"parlab: {service} service: the hub is stopping" in said, said[-3000:]
    assert stopped < 10, f"Ctrl-C took {stopped:.1f} s: {said[-3000:]}"
    deadline = time.monotonic() + 15
    while (left := processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left running after Ctrl-C: {left}"
