"""What a submission may use while graded, and what a cell reads when it used too much.

`SandboxOptions` is mixed into ResilientExecute: with `sandbox` on (the course's
autograder/nbgrader_config.py sets it; `make autograde UNSAFE=1` turns it off) every kernel
runs in a sandbox of its own (parlab.grading.sandbox) under these limits, for all of a
submission's processes together:

| option          | default  | what hitting it does                                        |
|-----------------|----------|-------------------------------------------------------------|
| memory_limit    | 6 GiB    | the kernel's out-of-memory killer ends a process of the tree |
| process_limit   | 1024     | a fork or a new thread is refused                            |
| file_limit      | 256 MiB  | writing past it fails (SIGXFSZ / "File too large")            |
| disk_limit      | 512 MiB  | each of /tmp, /dev/shm and the home folder is full           |

(Output per cell and per notebook: parlab.grading.autograde.outputs; wall time:
`Execute.timeout` and `ResilientExecute.submission_timeout`.) The sandbox's own counters say
which limit a cell hit (`hits()` before and after it); `limit_error` turns that into the cell's
error, which names the limit and its number, so the cell scores 0 with a reason the learner can
act on.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Integer
from traitlets.config import LoggingConfigurable

from parlab.grading.autograde.kernels import kernel_manager
from parlab.grading.sandbox import Limits

_DEFAULT = Limits()
LIMIT_ENAME = "LimitExceeded"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


class SandboxOptions(LoggingConfigurable):
    """The sandbox switch and its limits (see the module doc)."""

    sandbox = Bool(False, help="Run each kernel, and all it starts, in a sandbox of its own "
                   "(parlab.grading.sandbox).").tag(config=True)
    memory_limit = Integer(_DEFAULT.memory_bytes, help="Bytes of memory for all of a "
                           "submission's processes together.").tag(config=True)
    process_limit = Integer(_DEFAULT.processes, help="Processes and threads of a submission "
                            "at once.").tag(config=True)
    file_limit = Integer(_DEFAULT.file_bytes, help="Bytes of any one file a submission "
                         "writes.").tag(config=True)
    disk_limit = Integer(_DEFAULT.disk_bytes, help="Bytes of each of the sandbox's /tmp, "
                         "/dev/shm and home folder.").tag(config=True)

    def limits(self) -> Limits:
        return Limits(memory_bytes=self.memory_limit, processes=self.process_limit,
                      file_bytes=self.file_limit, disk_bytes=self.disk_limit)

    def manager_class(self, warm: bool) -> type:
        return kernel_manager(warm=warm, limits=self.limits() if self.sandbox else None)

    def hits(self, km: Any) -> dict[str, int]:
        """The sandbox's counters now ({} without a sandbox)."""
        sandbox = getattr(km, "sandbox", None)
        return sandbox.hits() if sandbox is not None else {}

    def limit_error(self, before: dict[str, int], after: dict[str, int],
                    text: str = "") -> str | None:
        """What the cell reads when it hit a limit between `before` and `after` (or its
        error `text` says it wrote too large a file); None if it hit none."""
        said = []
        if after.get("memory", 0) > before.get("memory", 0):
            said.append(f"your processes together used more than {_size(self.memory_limit)} "
                        "of memory, the grader's limit per submission, and one was killed")
        if after.get("processes", 0) > before.get("processes", 0):
            said.append(f"your code tried to run more than {self.process_limit} processes "
                        "and threads at once, the grader's limit per submission")
        if after.get("disk", 0) > before.get("disk", 0):
            said.append(f"your files filled {_size(self.disk_limit)}, the grader's limit "
                        "for /tmp, /dev/shm and your folder")
        if "File too large" in text or "SIGXFSZ" in text:
            said.append(f"your code wrote a file larger than {_size(self.file_limit)}, the "
                        "grader's limit per file")
        if not said:
            return None
        return ("; ".join(said) + ". This cell scores 0. Likely mistake: a tensor, a list or "
                "a file far bigger than the exercise needs, or a loop that never stops "
                "creating them.")
