"""Warm kernels: a grading process forks its kernels from one template that has imported torch.

A fresh kernel costs a Python start, ipykernel's and torch's imports (the notebook's first
cell), and, at the first distributed check, a forkserver: another Python that imports torch
again. Per submission that is about 3 to 4 s of CPU on the 2-core grader, the same work each
time. Here each nbgrader process starts one template (parlab.grading.autograde.zygote, the "zygote")
that imports the modules a kernel would import (`WARM_MODULES`) and runs nothing else: no
learner code, no torch operation, no thread of its own. For every kernel it forks a child
that becomes what `python -m ipykernel_launcher -f <connection file>` would be:

- its own session (`setsid`, as jupyter_client starts kernels), the kernel's environment,
  working directory, `sys.argv` and `sys.path`; fresh `random` and numpy seeds; SIGCHLD back
  to its default;
- before ipykernel starts (no thread yet), it forks its own multiprocessing forkserver, the
  one `parlab.launch.run` uses, with the environment ipykernel would have given it
  (`KERNEL_ENV_ADDED`); so ranks are forked, as before, from a process that has imported torch
  and run nothing, in the kernel's session, and die with the kernel;
- then `runpy` runs ipykernel_launcher as __main__.

A killed, hung or dead kernel is handled as before (parlab.grading.autograde.execute): it leads
its own session, so `kill_kernel_tree` finds it and everything it started; exec'd descendants
carry the kernel's token (PARLAB_KERNEL); every process carries the run's token (the zygote was
started with it), so nothing outlives the run (a process the learner forked without exec and
moved to a session of its own escapes the per-notebook kill, which looks for the kernel's token
in the environment it was exec'd with, and is killed at the run's end). The template never runs
learner code, so no submission sees another's state. A notebook whose folder holds a file or
package that would replace one of the template's modules (a learner's own `torch.py`) gets a
cold kernel instead: the child execs `python -m ipykernel_launcher`, so that file is imported as
it would be in a fresh kernel. The template imports matplotlib's core (not pyplot): each kernel
sets the backend it would have read at import (MPLBACKEND), and a folder with a matplotlibrc of
its own starts cold. What still differs from a fresh kernel: the hash seed is the template's.

`Zygote.get()` is what parlab.grading.autograde.kernels uses when `warm_kernels` is on
(autograder/nbgrader_config.py); if the template cannot start, or is not safe to fork (a
module of WARM_MODULES started a Python thread, or imported pyplot or ipywidgets, which
must see the kernel's IPython first), kernels start the usual way and a warning says why.
A sandboxed kernel is forked the same way, then enters its sandbox (`spawn(..., jail=)`).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from parlab.grading.autograde.zygote import recv, send

TEMPLATE = Path(__file__).with_name("zygote.py")
START_TIMEOUT_S = 300


# --- the grader's side ---------------------------------------------------------------------------
class WarmProcess:
    """A forked kernel, seen through a pidfd, with what jupyter_client uses of a Popen."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid, self._pidfd = pid, pidfd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.returncode = 0  # not our child: the exit status is the template's to see
            os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
            time.sleep(0.02)
        return 0

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The template of one grading process (started on first use, ends with this process)."""

    _lock = threading.Lock()
    _instance: Zygote | None = None
    _failed: str | None = None

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from runpy import run_path; run_path({str(TEMPLATE)!r}, "
             "run_name='__main__')", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = mine
        ready = recv(mine, timeout=START_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            self.proc.kill()
            raise RuntimeError((ready or {}).get("why") or "the template ended at start-up")
        atexit.register(self.close)

    def close(self) -> None:
        """End the template and wait for it (at exit): the run's check for processes left
        behind comes right after its grading processes end, and must not find it."""
        self.sock.close()  # EOF: the template's loop ends
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @classmethod
    def get(cls) -> Zygote | None:
        """This process's template, or None (the reason logged once) if it cannot run."""
        with cls._lock:
            if cls._instance is not None and cls._instance.proc.poll() is not None:
                cls._instance = None  # it died (killed by a learner's code?): start another
            if cls._instance is None and cls._failed is None:
                try:
                    cls._instance = Zygote()
                except Exception as exc:  # noqa: BLE001 - grading goes on, cold
                    cls._failed = str(exc)
                    print(f"[parlab] warm kernels off, kernels start cold: {exc}",
                          file=sys.stderr)
            return cls._instance

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str,
              forkserver: bool = True, jail: dict | None = None) -> WarmProcess:
        """A kernel forked from the template; inside the sandbox `jail` describes
        (parlab.grading.sandbox.jail), if given, whose cwd and env it then takes."""
        with self._lock:
            send(self.sock, {"argv": argv, "env": env, "cwd": cwd, "forkserver": forkserver,
                             "jail": jail})
            reply = recv(self.sock, timeout=60)
            if not reply:
                raise RuntimeError("the template did not answer")
            pid = int(reply["pid"])
            if not pid:
                send(self.sock, {"go": False})
                raise RuntimeError("the kernel could not enter its sandbox")
            pidfd = os.pidfd_open(pid)
            send(self.sock, {"go": True})
        return WarmProcess(pid, pidfd)
