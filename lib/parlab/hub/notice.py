"""The line a learner reads when the hub gave their server no GPU (all were held).

The hub's pre-spawn hook (`parlab.hub.hooks`) starts such a server with PARLAB_GPUS empty,
the GPUs hidden (CUDA_VISIBLE_DEVICES=""), PARLAB_BACKEND=gloo and PARLAB_HUB_FALLBACK set to
why. The launcher (`parlab.launch.devices.placement`) calls `announce()` before it starts
ranks, so the first `run` in a notebook prints the line under the cell, once per kernel.
"""

from __future__ import annotations

import os
import sys

__all__ = ["fallback_line", "announce"]
_said = [False]


def fallback_line() -> str | None:
    """The line to show, or None when this server was not started as a CPU fallback."""
    why = os.environ.get("PARLAB_HUB_FALLBACK", "").strip()
    if not why or os.environ.get("PARLAB_GPUS", "").strip():
        return None
    return (f"parlab: {why}, so your ranks run on the CPU over gloo (slower; every exercise "
            "still works). To get GPUs later: File > Hub Control Panel > Stop My Server, "
            "then Start My Server.")


def announce() -> None:
    """Print the fallback line once per process (to stderr, under the notebook's cell)."""
    line = fallback_line()
    if line is not None and not _said[0]:
        _said[0] = True
        print(line, file=sys.stderr, flush=True)
