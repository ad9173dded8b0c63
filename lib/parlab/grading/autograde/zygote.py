"""The template that warm kernels are forked from (see parlab.grading.autograde.warm).

It is run by path, not as a module of parlab.grading, so that the template holds only what a
kernel would import (`WARM_MODULES`), not the grading package and nbgrader:

    python -c "from runpy import run_path; run_path('<this file>', run_name='__main__')" FD

FD is one end of a socketpair: the grader (parlab.grading.autograde.warm.Zygote) sends one
request per kernel, the template forks, and the child turns into `python -m ipykernel_launcher
ARGS`. Nothing here imports parlab.grading.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
from typing import Any, cast

# What the template imports: the forkserver's own preload (parlab.launch.runner), ipykernel,
# and the checks of every module, none of which imports matplotlib or ipywidgets. With
# parlab.compose imported here, each kernel's forkserver, forked from the template, already
# holds what the ranks of modules 07 to 09 import (torch._dynamo, parlab.compose): imported
# once per grading process, not once per kernel or per rank.
# matplotlib's core (about 0.5 s of CPU a kernel) without pyplot: at import it reads only its
# matplotlibrc and MPLBACKEND, which a kernel says again (`_matplotlib_as_if_fresh`).
MATPLOTLIB = ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg")
WARM_MODULES = (
    "torch", "torch.distributed", "cloudpickle", "parlab.launch.rank",
    "torch.fx.experimental.symbolic_shapes", "torch._dynamo", "numpy", "ipykernel.kernelapp",
    "parlab.launch", "parlab.check", "parlab.costs", "parlab.model", "parlab.compose",
    "parlab.capstone", "parlab.check.checkpoint", "parlab.check.collectives",
    "parlab.check.composition", "parlab.check.cp", "parlab.check.fsdp", "parlab.check.moe",
    "parlab.check.pp", "parlab.check.sp", "parlab.check.tp", "parlab.check.whole",
    *MATPLOTLIB,
)
# Modules that must be imported in the kernel itself (they register with its IPython, or
# pick a backend): the template refuses to serve if one got in.
KERNEL_ONLY = ("matplotlib.pyplot", "ipywidgets", "matplotlib_inline")
# What ipykernel adds to os.environ at start-up (kernelapp.init_gui_pylab and
# zmqshell.init_environment): the forkserver, forked before ipykernel starts, gets it too.
KERNEL_ENV_ADDED = {"TERM": "xterm-color", "CLICOLOR": "1", "FORCE_COLOR": "1",
                    "CLICOLOR_FORCE": "1", "PAGER": "cat", "GIT_PAGER": "cat"}
MPLBACKEND = "module://matplotlib_inline.backend_inline"
LAUNCHER = ["-m", "ipykernel_launcher"]

# --- the wire: length-prefixed JSON over a socketpair ------------------------------------------
def send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv(sock: socket.socket, timeout: float | None = None) -> dict | None:
    """One message, or None at EOF."""
    sock.settimeout(timeout)
    head = _read(sock, 4)
    if head is None:
        return None
    body = _read(sock, struct.unpack("!I", head)[0])
    return None if body is None else json.loads(body)


def _read(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- the template (run by path, see the module doc) -------------------------------------------
def _unsafe() -> str | None:
    """Why forking this process would not give a kernel its fresh state, or None."""
    loaded = [m for m in KERNEL_ONLY if m in sys.modules]
    if loaded:
        return f"WARM_MODULES imported {', '.join(loaded)}, which must load in the kernel"
    if threading.active_count() != 1:
        return f"a Python thread is running in the template: {threading.enumerate()}"
    return None


def _reap(_signum: int, _frame: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(fd: int) -> dict | None:
    """The template's loop. Returns only in a forked child: the request it must become."""
    import importlib

    sock = socket.socket(fileno=fd)
    try:
        for name in WARM_MODULES:
            importlib.import_module(name)
        why = _unsafe()
    except Exception as exc:  # noqa: BLE001 - reported to the grader, which starts cold
        why = f"importing WARM_MODULES failed: {exc!r}"
    send(sock, {"ready": why is None, "why": why})
    if why is not None:
        return None
    signal.signal(signal.SIGCHLD, _reap)  # kernels are reaped (their CPU time counted) as they end
    while (request := recv(sock)) is not None:
        go_r, go_w = os.pipe()
        report_r, report_w = os.pipe()
        if os.fork() == 0:
            sock.close()
            os.close(go_w)
            os.close(report_r)
            _report_kernel(request, report_w)
            os.read(go_r, 1)  # wait until the grader holds a pidfd on us
            os.close(go_r)
            return request
        os.close(go_r)
        os.close(report_w)
        kernel = int(os.read(report_r, 32) or b"0")
        os.close(report_r)
        send(sock, {"pid": kernel})
        recv(sock)  # "go"
        if kernel:
            os.write(go_w, b"g")
        os.close(go_w)
    return None


def _report_kernel(request: dict, report: int) -> None:
    """In the forked child: write the kernel's pid to `report` (0 if it could not start).
    With a sandbox (request["jail"]) the kernel is a child of this one, inside the sandbox's
    namespaces (parlab.grading.sandbox.jail); this one reports it and exits."""
    spec = request.get("jail")
    if spec is None:
        os.write(report, str(os.getpid()).encode())
        os.close(report)
        return
    try:
        kernel = _jail().enter(spec)
    except BaseException as exc:  # noqa: BLE001 - never back into the template's loop
        os.write(report, b"0")
        print(f"[parlab] could not enter the sandbox: {exc!r}", file=sys.stderr, flush=True)
        os._exit(1)
    if kernel:  # outside the sandbox: hand over and go
        os.write(report, str(kernel).encode())
        os._exit(0)
    os.close(report)


def _jail() -> Any:
    """parlab.grading.sandbox.jail, loaded by path (the template imports nothing of
    parlab.grading)."""
    import importlib.util

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # parlab/grading
    spec = importlib.util.spec_from_file_location(
        "parlab_jail", os.path.join(here, "sandbox", "jail.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fork_forkserver() -> None:
    """Start this kernel's multiprocessing forkserver by forking (see the module doc)."""
    from multiprocessing import connection, forkserver, util

    from parlab.launch.runner import forkserver_preload

    # multiprocessing's own forkserver object, filled in as its ensure_running would (3.11)
    private: Any = forkserver  # its module-level ForkServer, and connection's address maker
    server = private._forkserver
    listener = socket.socket(socket.AF_UNIX)
    address = cast(Any, connection).arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    preload = forkserver_preload()  # imported already, all of it: WARM_MODULES holds it
    pid = os.fork()
    if pid == 0:  # the forkserver: it ends when every holder of alive_w has gone
        os.close(alive_w)
        try:
            forkserver.main(listener.fileno(), alive_r, preload)
        finally:
            os._exit(0)
    listener.close()
    os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    server._preload_modules = preload


def _shadowed(folder: str) -> list[str]:
    """Top-level modules of the template that a file or folder in `folder` (the notebook's)
    would replace in a fresh kernel, where that folder comes first on sys.path."""
    tops = {m.split(".")[0] for m in sys.modules if not m.startswith("_")}
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if n.removesuffix(".py") in tops and (
        n.endswith(".py") or os.path.isdir(os.path.join(folder, n))))


def _matplotlib_as_if_fresh() -> list[str]:
    """In the kernel's environment and folder: set what matplotlib would have read at import
    (MPLBACKEND, ipykernel's default when unset); a matplotlibrc other than the template's (in
    the folder, or named by MATPLOTLIBRC or MPLCONFIGDIR) is returned, to start cold."""
    mpl = sys.modules.get("matplotlib")
    if mpl is None:
        return []
    template_rc = os.path.join(mpl.get_data_path(), "matplotlibrc")
    try:
        rc = mpl.matplotlib_fname()
    except Exception:  # noqa: BLE001 - whatever it is, a fresh kernel reads it
        rc = ""
    if os.path.realpath(rc) != os.path.realpath(template_rc):
        return [rc or "matplotlibrc"]
    os.environ["MPLBACKEND"] = os.environ.get("MPLBACKEND") or MPLBACKEND  # as ipykernel does
    mpl.rcParams["backend"] = os.environ["MPLBACKEND"]
    return []


def become_kernel(request: dict) -> None:
    """In the forked child: turn into `python -m ipykernel_launcher ARGS` (never returns)."""
    import random
    import runpy

    jailed = request.get("jail") is not None
    if os.getsid(0) != os.getpid():
        os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not jailed:  # as jupyter_client sets it: the kernel ends when its parent, the
        # template, has gone (and prints no connection banner); a sandboxed kernel ends
        # with its sandbox, and nothing in its environment names the grader
        os.environ["JPY_PARENT_PID"] = str(os.getppid())
    shadowed = _shadowed(os.getcwd()) or _matplotlib_as_if_fresh()
    if shadowed:  # a learner's torch.py (say): start cold, so that it is imported as it
        # would be in a fresh kernel, and the grade is the same
        os.execv(sys.executable, [sys.executable, *LAUNCHER, *request["argv"]])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.path[0] = os.getcwd()  # as `python -m` sets it; ipykernel_launcher removes it
    if request.get("forkserver", True):
        if not os.environ.get("MPLBACKEND"):
            os.environ["MPLBACKEND"] = MPLBACKEND
        os.environ.update(KERNEL_ENV_ADDED)
        _fork_forkserver()
    # ipykernel read JPY_PARENT_PID when the template imported it: say it again
    sys.argv = ["ipykernel_launcher", *request["argv"],
                f"--IPKernelApp.parent_handle={os.environ.get('JPY_PARENT_PID', '0')}"]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    sys.exit(0)



if __name__ == "__main__":
    _request = serve(int(sys.argv[1]))
    if _request is not None:
        become_kernel(_request)
