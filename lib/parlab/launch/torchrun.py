"""What a script started by torchrun (scripts/train.py, scripts/capstone.py) does before any
process group starts: refuse options that do not fit, once.

torchrun starts the same command in every process, so an error raised after
`init_process_group` prints one traceback per rank under torchrun's banner. Instead the
options are checked first, against the world size torchrun sets (WORLD_SIZE): rank 0 alone
prints the reason as argparse does (`prog: error: ...`, here with a pointer to --help instead
of the whole usage), and every process exits with status 2 (a usage error), before any
connection is made. torchrun then adds its own banner ("scripts/train.py FAILED ... exitcode
2"); that one is torchrun's, not a rank's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

__all__ = ["world_size", "is_first_process", "fits_or_exit"]

T = TypeVar("T")


def world_size() -> int:
    """The number of processes torchrun started (1 for a plain `python script.py`)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_first_process() -> bool:
    """Rank 0 of the whole run (every node), or a plain `python script.py`."""
    return os.environ.get("RANK", "0") == "0"


def _refuse(parser: argparse.ArgumentParser, reason: str) -> NoReturn:
    if is_first_process():
        print(f"{parser.prog}: error: {reason}\n(`{parser.prog} --help` lists the options)",
              file=sys.stderr, flush=True)
    sys.exit(2)


def fits_or_exit(parser: argparse.ArgumentParser, plan: Callable[[], T]) -> T:
    """`plan()` (what the options ask for, built and checked without a process group); a
    ValueError from it ends every process with status 2, rank 0 saying why."""
    try:
        return plan()
    except ValueError as exc:
        _refuse(parser, str(exc))
