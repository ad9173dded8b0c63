"""A hub service that ends with its hub, at once, however the hub ends.

    python lib/parlab/hub/service.py idle-culler -- python -m jupyterhub_idle_culler ...

autograder/hub/jupyterhub_config.py starts the idle culler and the gpu-pool service through
this file, run as a script (it imports nothing but the standard library, so its signal
handlers are in place within a few milliseconds of its start; `python -m parlab.hub.service`
works too, after importing the package).

JupyterHub starts a managed service in a session of its own (so that Ctrl-C in the hub's
terminal never reaches it) and, when it stops, sends it SIGINT and waits up to
`LocalProcessSpawner.interrupt_timeout` (30 s in JupyterHub 6) before SIGTERM: a service that
does not end on SIGINT holds the hub's stop that long, silent after "Cleaning up 1
services...". A hub that dies without stopping (SIGKILL, a crash, the OOM killer) stops nothing:
the service lives on, in its own session, polling a hub that is gone.

Here the service runs as a child of this process, which:
- on SIGINT or SIGTERM (the hub stopping it) says what it stops, ends the service (SIGTERM,
  then SIGKILL after `GRACE_S`) and exits: a hub's stop takes a second, not 30;
- asks the kernel for SIGTERM when its parent (the hub) dies (`prctl(PR_SET_PDEATHSIG)`; JupyterHub
  starts services from its main thread, which lives as long as the hub), and also looks every
  `EVERY_S` whether its parent is still the hub (other systems, or a parent that changed
  before the request): a hub killed with SIGKILL takes its services with it;
- gives the service itself SIGKILL as its parent-death signal: if this process is killed, the
  service ends too.
The service's own exit ends this process with the same status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

__all__ = ["main", "set_parent_death_signal"]

GRACE_S = 2.0
EVERY_S = 0.5
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent thread ends; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(f"the hub is stopping ({signal.Signals(signum).name})")


def _say(name: str, text: str) -> None:
    print(f"parlab: {name} service: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m parlab.hub.service NAME -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    name, command = args[0], args[2:]
    hub = os.getppid()
    signal.signal(signal.SIGINT, _raise_stop)
    signal.signal(signal.SIGTERM, _raise_stop)
    set_parent_death_signal(signal.SIGTERM)
    child = None
    try:
        if os.getppid() != hub:                          # the hub died before the request
            raise _Stop("the hub is gone")
        child = subprocess.Popen(command, preexec_fn=lambda: set_parent_death_signal(
            signal.SIGKILL))
        while True:
            code = child.poll()
            if code is not None:
                return code
            if os.getppid() != hub:
                raise _Stop("the hub is gone")
            time.sleep(EVERY_S)
    except _Stop as stop:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if child is None or child.poll() is not None:
            _say(name, f"{stop.why}: {' '.join(command[:3])} is not running")
            return 0
        started = time.monotonic()
        _say(name, f"{stop.why}: stopping {' '.join(command[:3])} (pid {child.pid})")
        child.terminate()
        try:
            child.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        _say(name, f"stopped in {time.monotonic() - started:.1f} s")
        return 0


if __name__ == "__main__":
    sys.exit(main())
