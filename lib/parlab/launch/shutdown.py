"""A kernel that ran ranks exits promptly when Jupyter shuts it down, and leaves nothing.

Measured (jupyter_client 8, ipykernel 7, a loaded 2-core machine): on a shutdown request
ipykernel SIGTERMs the children in its process group, again and again (0.01 s up to 10 s
apart, 14 s in all), until none is left. The launcher's forkserver dies at the first, but
multiprocessing's resource tracker ignores SIGTERM, so the kernel was still waiting when
Jupyter SIGTERMed it after 2.5 s (half its `shutdown_wait_time`): its atexit never ran, and
/tmp kept multiprocessing's pymp-* folder (the forkserver's socket) and parlab's scratch
root. A kernel that never started ranks had no child and left at once. Then a process that
imported torch spends 2-3 s of its exit in the garbage collector (0.7 s when it is frozen).

`stop_helpers()` ends the forkserver (SIGTERM: it holds nothing to clean, and its own exit
would spend those seconds in the collector) and the resource tracker (closing its pipe, as
multiprocessing's own tests stop it), and unlinks the forkserver's socket; a later `run`
starts new ones. `stop_helpers_at_kernel_shutdown()`, called by `run` in an IPython kernel,
makes the kernel's shutdown request do that before ipykernel looks for children, and freeze
the garbage collector when atexit begins: the kernel then exits on its own, its atexit
removes the pymp folder and the scratch root (parlab.launch.scratch), and the objects left in
reference cycles are not collected one by one (a process killed 2.5 s later would not have
collected them either). Outside a kernel (a script, a test) nothing changes: the helpers end
with the process that started them, as multiprocessing does it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
from typing import Any

__all__ = ["stop_helpers", "stop_helpers_at_kernel_shutdown"]


def stop_helpers() -> None:
    """End this process's forkserver and resource tracker (multiprocessing's), if running."""
    from multiprocessing import forkserver, resource_tracker

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    # their private `_stop` (multiprocessing's tests call it): close the pipe each watches,
    # reap it; the forkserver's also unlinks its socket
    for helper in (server, resource_tracker._resource_tracker):
        stop = getattr(helper, "_stop", None)
        with contextlib.suppress(OSError, ChildProcessError):
            if stop is not None:
                stop()


def _kernel() -> Any:
    """The ipykernel Kernel this process serves, or None (a script, a test, plain IPython)."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return None
    shell = sys.modules["IPython"].get_ipython()
    return getattr(shell, "kernel", None)


def stop_helpers_at_kernel_shutdown() -> None:
    """In an IPython kernel: its shutdown request first stops the helpers (once installed,
    for the kernel's life)."""
    kernel = _kernel()
    if kernel is None or getattr(kernel, "_parlab_stops_helpers", False):
        return
    requested = kernel.do_shutdown

    def do_shutdown(restart: bool, *args: Any, **kwargs: Any) -> Any:
        stop_helpers()
        atexit.register(gc.freeze)  # registered last, runs first
        return requested(restart, *args, **kwargs)

    kernel.do_shutdown = do_shutdown
    kernel._parlab_stops_helpers = True
