"""The hub's services end with the hub, at once, however it ends (`make test-hub`, about 15 s).

- parlab.hub.service, given SIGINT (what JupyterHub sends a service it stops), ends a service
  that ignores SIGINT and SIGTERM within its grace time and says what it stopped; JupyterHub
  alone waits 30 s (interrupt_timeout) and then 30 more (term_timeout) for such a one;
- the trial hub (autograder/hub/jupyterhub_config.py, a fake plan of 2 GPUs: the idle culler and
  the gpu-pool service) killed with SIGKILL takes its services (and each service's own process)
  with it within seconds: before, they lived on in sessions of their own, polling a hub that
  was gone (seen: both were still there). test_hub_e2e's `make hub` test stops the same hub as
  Ctrl-C does: within seconds, its output naming each service it stopped, no process left.
  The proxy outlives a hub killed so, as JupyterHub means it to (it keeps serving through a
  restart, and the next hub finds and replaces it: `jupyterhub-proxy.pid`); the test ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT
from test_hub_e2e import BIN, free_ports, processes_of

from parlab.hub.service import GRACE_S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_HUB") != "1",
                       reason="the hub's tests run with `make test-hub`"),
]

STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit():
                stat = (proc / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_service_that_ignores_signals_ends_within_its_grace():
    wrapper = subprocess.Popen([sys.executable, str(ROOT / "lib/parlab/hub/service.py"),
                                "stubborn", "--",
                                sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert wrapper.stdout.readline().strip() == "ready"
        [service] = children(wrapper.pid)
        started = time.monotonic()
        wrapper.send_signal(signal.SIGINT)
        wrapper.wait(timeout=GRACE_S + 5)
        took = time.monotonic() - started
        said = wrapper.stderr.read()
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
    assert took < GRACE_S + 1.5, took
    assert not alive(service), "the service outlived its wrapper"
    assert "parlab: stubborn service: the hub is stopping (SIGINT): stopping" in said, said
    assert "stopped in" in said, said


def _is_proxy(line: str) -> bool:
    """The proxy's process: configurable-http-proxy, or parlab.hub.proxy wrapping its port."""
    return "configurable-http-proxy" in line or "parlab.hub.proxy" in line


def start_hub(tmp: Path, port: int) -> tuple[subprocess.Popen, list[int]]:
    """The trial hub with the idle culler and the gpu-pool service; (hub, service pids)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PARLAB_HUB_RUN": str(tmp / "run"),
           "PARLAB_HUB_PORT": str(port), "PARLAB_HUB_GPUS": "0,1"}
    log = open(tmp / "hub.log", "a")
    hub = subprocess.Popen([str(BIN / "jupyterhub"), "-f",
                            str(ROOT / "autograder" / "hub" / "jupyterhub_config.py")],
                           cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    log.close()
    deadline = time.monotonic() + 120
    services: list[int] = []
    while time.monotonic() < deadline and hub.poll() is None:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/api/", timeout=5)
            services = [int(line.split(":")[0]) for line in processes_of(tmp / "run")
                        if int(line.split(":")[0]) != hub.pid and not _is_proxy(line)]
            if len(services) >= 4:       # two services, each a wrapper and its process
                return hub, services
        time.sleep(0.5)
    hub.kill()
    raise AssertionError("the hub did not start its services: "
                         + (tmp / "hub.log").read_text()[-3000:])


def end_ours(run: Path) -> list[str]:
    left = processes_of(run)
    for line in left:                    # they name our folder: ours
        with contextlib.suppress(OSError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return left


def test_the_services_end_with_a_hub_killed(tmp_path):
    """(A hub stopped as Ctrl-C stops it: test_hub_e2e's `make hub` test.)"""
    run = tmp_path / "run"
    try:
        hub, services = start_hub(tmp_path, free_ports(3))
        os.kill(hub.pid, signal.SIGKILL)                    # no stop, no cleanup
        hub.wait()
        deadline = time.monotonic() + 10
        while [p for p in services if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [line for line in processes_of(run) if int(line.split(":")[0]) in services]
        assert not left, f"services left after the hub was killed: {left}"
    finally:
        end_ours(run)
