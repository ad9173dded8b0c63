"""The line a run shows in a notebook while it waits for its ranks.

A check that runs for more than a few seconds would otherwise show only the cell's `[*]`.
After `SHOW_AFTER_S`, `WaitingLine` puts one line under the cell and rewrites it about once a
second: how long the run has waited, its limit, and what the ranks are doing (from the watch,
`parlab.launch.diagnose`). When the run ends, the line is cleared; the result or the error
says the rest. Outside a Jupyter kernel (tests, scripts, the grader's verifier) it shows
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SHOW_AFTER_S = 3.0
EVERY_S = 1.0


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebooks
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class WaitingLine:
    """Call `show(waiting, world, doing)` from the run's loop (`doing()` says what the ranks
    do, asked only when the line is redrawn); `close()` when the run ends."""

    def __init__(self, timeout: float, *, enabled: bool | None = None) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.enabled = _in_kernel() if enabled is None else enabled
        self.shown_at = 0.0
        self.handle: Any = None

    def text(self, waiting: int, world: int, doing: str) -> str:
        elapsed = time.monotonic() - self.started
        return (f"waiting for {waiting} of {world} ranks: {elapsed:.0f} s (the limit is "
                f"{self.timeout:g} s after they start); {doing}")

    def show(self, waiting: int, world: int, doing: Callable[[], str]) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.started < SHOW_AFTER_S or now - self.shown_at < EVERY_S:
            return
        self.shown_at = now
        self._display(self.text(waiting, world, doing()))

    def close(self) -> None:
        if self.handle is not None:
            self._display("")

    def _display(self, line: str) -> None:
        try:
            from IPython.display import display
        except ImportError:  # pragma: no cover
            return
        data = {"text/plain": line}
        if self.handle is None:
            self.handle = display(data, raw=True, display_id=True)
        else:
            self.handle.update(data, raw=True)
