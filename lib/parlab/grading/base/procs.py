"""Find and end the processes of a grading run: a kernel's session, or an environment token.

A kernel leads its own session (jupyter_client starts it with start_new_session) and carries a
fresh PARLAB_KERNEL=<token> in its environment (parlab.grading.autograde.execute); a parallel
autograde carries PARLAB_GRADE_RUN=<token> (parlab.grading.engines.grade). Both are inherited by
everything started below them, ranks included, and survive the kernel's death, when a
process-tree walk from the kernel would find nothing. Linux only (/proc).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

KERNEL_ENV = "PARLAB_KERNEL"  # set to a fresh token in each kernel's environment


def processes(*, sid: int | None = None, env: str | None = None) -> list[int]:
    """Live (not zombie) processes of session `sid`, or whose environment holds `env`
    ("KEY=value"); Linux /proc. Never this process."""
    needle = env.encode() if env else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if (sid is not None and int(fields[3]) == sid) or (
                    needle and needle in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def kill_kernel_tree(sid: int | None, env: str | None, wait: float = 5.0) -> int:
    """SIGKILL a kernel and everything it started; return how many processes were killed.

    A kernel leads its own session (jupyter_client's start_new_session), and what it starts
    stays in that session even when adopted by init after the kernel died, so the session
    finds ranks a process-tree walk would miss; the environment token finds what left it.
    """
    if sid is not None and (not sid or sid == os.getsid(0)):
        sid = None
    if sid is None and not env:
        return 0
    pids = processes(sid=sid, env=env)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait
    while processes(sid=sid, env=env) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)
