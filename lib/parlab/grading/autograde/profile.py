"""Where a graded notebook's time goes: wall and CPU seconds per phase (`ResilientExecute.profile`).

With `--ResilientExecute.profile=True` the executor records, in the autograded notebook's
metadata (`parlab.grading.autograde.profile`), {phase: [wall s, CPU s]} for: kernel start (until the
kernel answers), imports (the cell tagged `imports`, else the first code cell), answer cells,
test cells (in a cold kernel the first one also starts the forkserver for the ranks),
demonstration cells (every other code cell), replays after a restart, kernel shutdown
(wall only), and the verifier (wall only: its work is in the grading process and the
verifier's own sandbox, parlab.grading.verify). CPU is that of the kernel's session, ranks
included (user + system, with the children it has reaped), read from /proc;
benchmarks/bench_class.py adds them up over a class. Off by default: each reading scans
/proc.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from nbformat import NotebookNode

from parlab.grading.base.cells import is_answer_cell, is_graded_cell

PHASES = ("kernel start", "imports", "answers", "tests", "demos", "replay", "shutdown",
          "verifier")
_TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid: int | None) -> float:
    """CPU seconds used so far by the live processes of session `sid` and the children they
    reaped (Linux /proc); 0 without a session."""
    if not sid:
        return 0.0
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / _TICK


def phase_of(cell: NotebookNode, first_code: bool) -> str:
    """The phase a code cell's time counts under."""
    if is_graded_cell(cell):
        return "tests"
    if is_answer_cell(cell):
        return "answers"
    if "imports" in cell.get("metadata", {}).get("tags", []) or first_code:
        return "imports"
    return "demos"


class Timings:
    """Accumulates (wall, CPU) per phase between `start` and successive `mark` calls."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.phases: dict[str, list[float]] = {}
        self._wall = time.monotonic()
        self._cpu = 0.0
        self._sid: int | None = None

    def start(self, sid: int | None = None) -> None:
        """A new kernel (or none yet): time and CPU count from here."""
        self._wall, self._cpu, self._sid = time.monotonic(), session_cpu(sid), sid

    def mark(self, phase: str, sid: int | None = None) -> None:
        """Charge what was spent since the last mark to `phase`."""
        if not self.enabled:
            return
        if sid is not None and sid != self._sid:
            self._sid, self._cpu = sid, 0.0  # a forked kernel's CPU counts from its start
        now, cpu = time.monotonic(), session_cpu(self._sid)
        spent = self.phases.setdefault(phase, [0.0, 0.0])
        spent[0] += now - self._wall
        spent[1] += max(0.0, cpu - self._cpu)
        self._wall, self._cpu = now, cpu

    def record(self) -> dict[str, list[float]]:
        return {k: [round(w, 2), round(c, 2)] for k, (w, c) in self.phases.items()}
