"""What a learner reads when a check fails, as the issue bounds it: at most MAX_LINES lines
and no frame of the library (lib/parlab, torch, the standard library). Shared by
tests/test_notebooks.py (every failing test cell of the blank release, as the kernel showed
it) and tests/mistakes.py (every entry of the mistakes corpus, as IPython would render it)."""

from __future__ import annotations

import re

MAX_LINES = 15
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LIBRARY_FRAME = re.compile(r'File "?[^"\n]*(/parlab/|site-packages|/lib/python3)|'
                            r'^\s*File [^\n]*\.py:\d+', re.M)


def shown(traceback: list[str]) -> list[str]:
    """The lines of an error as a notebook shows it (an nbformat error output's traceback, or
    `_render_traceback_()`), colours removed."""
    return _ANSI.sub("", "\n".join(traceback)).split("\n")


def unreadable(lines: list[str]) -> str | None:
    """Why these lines are not what a learner should read, or None."""
    library = [ln for ln in lines if _LIBRARY_FRAME.search(ln)]
    if library:
        return f"library frames: {library[:3]}"
    if len(lines) > MAX_LINES:
        return f"{len(lines)} lines (at most {MAX_LINES})"
    return None
