"""What a learner reads when something fails, and the one way a check refuses the course's answer.

- `CheckFailed`: a learner's answer disagrees with the reference (an AssertionError, so nbgrader
  scores the cell 0). Its message says which rank, which tensor, expected against got, and a
  "Likely mistake:" line.
- `Readable`: mixed into every error a learner meets (`CheckFailed`, and the launcher's
  `RankError`, `CollectiveMismatch`, `CollectiveTimeout`). In a notebook IPython shows
  `_render_traceback_()`: the message and the frames of the learner's own code, nothing from
  parlab, torch or the standard library. Plain Python (pytest, scripts) prints the full
  traceback as usual.
- `NotWritten`: a check in the kernel reached the release's stub; it reads as the stub's
  NotImplementedError and its line: "not written yet: <the stub's words>". A run whose ranks
  all reached it (the launcher's RankError) reads the same (`unwritten_message`,
  `stub_raised`).
- `refused(references, message)`: inside the block, every function in `references` (for a
  class: every function it defines) raises `CheckFailed(message)`. The functions' code objects
  are swapped rather than their names rebound, so an answer that reaches the reference through
  an alias, a wrapper or a subclass is refused too. Graded checks use it inside the ranks,
  around the learner's call; reference code carries no hook of its own.

This module imports nothing from parlab: reference code, the launcher and the checks all use it.
"""

from __future__ import annotations

import contextlib
import re
import sys
import sysconfig
import traceback
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CheckFailed", "NotWritten", "Readable", "refused", "reference_message",
           "learner_frames", "cell_name", "stub_raised", "unwritten_message", "LIKELY"]

LIKELY = "Likely mistake:"
MAX_FRAMES = 4  # the learner's innermost frames shown under a failure
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)\n'
                    r'(?P<code>(?:\s{4,}(?![~^ ]*$)\S.*\n)?)(?:\s*[~^]+\s*\n)?', re.M)
_LIBRARY = tuple(str(Path(p).resolve()) for p in {
    str(Path(__file__).parent),  # parlab itself
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]} if p)


def _is_library(path: str) -> bool:
    if path.startswith("<") and not path.startswith("<ipython-input"):
        return True  # <frozen ...>, <string>, <dynamic-code>
    try:
        resolved = str(Path(path).resolve())
    except (OSError, RuntimeError):
        return False
    return resolved.startswith(_LIBRARY) or "/site-packages/" in resolved


def cell_name(path: str) -> str:
    """'Cell In[12]' for a notebook cell's file (as IPython names it), else the path."""
    shell = sys.modules.get("IPython") and _ipython()
    if shell is not None:
        named = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(path)
        if named:
            return " ".join(named)
    return path


def _ipython() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency of the notebooks only
        return None
    return get_ipython()


def learner_frames(tb_text: str) -> list[str]:
    """The frames of a formatted traceback that are the learner's own code, innermost last,
    each as 'Cell In[12], line 7, in forward' plus its source line."""
    out = []
    for m in _FRAME.finditer(tb_text):
        if _is_library(m.group("path")):
            continue
        where = f"{cell_name(m.group('path'))}, line {m.group('line')}, in {m.group('name')}"
        code = m.group("code").strip()
        out.append(f"  {where}" + (f"\n    {code}" if code else ""))
    return out[-MAX_FRAMES:]


def stub_raised(tb_text: str) -> bool:
    """Whether a formatted traceback ends in the learner's own `raise`: the innermost frame is
    the learner's code (a cell, or code run from its text: "<dynamic-code>" in a rank,
    "<answer cell>" under the verifier) and its line, where known, is a raise statement. A
    NotImplementedError raised there is the release's stub; one raised inside torch (a module
    without forward, an op a device lacks, called from the learner's line) is not."""
    frames = list(_FRAME.finditer(tb_text))
    if not frames:
        return False
    path, code = frames[-1].group("path"), frames[-1].group("code").strip()
    if path.startswith("<frozen") or (not path.startswith("<") and _is_library(path)):
        return False
    return not code or code.startswith("raise")


def unwritten_message(said: str) -> str:
    """What an answer that reached its stub reads, in the kernel or on every rank."""
    said = said.strip() or "write the answer in its cell, run it, then this check."
    return f"not written yet: {said}"


def _frames_of(exc: BaseException) -> list[str]:
    """Learner frames of the exceptions `exc` was raised while handling: the learner's own
    error, when a check turned it into a message. `exc`'s own frames are the check's."""
    chain: list[BaseException] = []
    link = exc.__cause__ or exc.__context__
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    for link in reversed(chain):
        frames = learner_frames("".join(traceback.format_tb(link.__traceback__)))
        if frames:
            return frames
    return []


class Readable:
    """Mixin: how a learner-facing error renders in a notebook (IPython's hook)."""

    learner_traceback: str = ""  # a formatted traceback from another process (a rank's)
    shown_as: str = ""  # the name a learner reads, when not the class's own

    def summary(self) -> str:
        """The message a learner reads; subclasses may shorten what `str()` holds."""
        return str(self)

    def _render_traceback_(self) -> list[str]:
        assert isinstance(self, BaseException)
        frames = learner_frames(self.learner_traceback) if self.learner_traceback else []
        frames = frames or _frames_of(self)
        lines = [f"{self.shown_as or type(self).__name__}: {self.summary()}"]
        if frames:
            lines.append("Your code, where it failed (innermost last):")
            lines += frames
        return "\n".join(lines).split("\n")


class CheckFailed(Readable, AssertionError):
    """A learner's answer disagrees with the reference; the message says how."""

    def __init__(self, message: str = "", *, learner_traceback: str = "") -> None:
        super().__init__(message)
        self.learner_traceback = learner_traceback


class NotWritten(Readable, NotImplementedError):
    """A check reached the release's stub (`raise NotImplementedError()`): the answer is not
    written yet. Shown as the NotImplementedError it is, with the stub's line, not the check's
    frames."""

    shown_as = "NotImplementedError"

    @classmethod
    def of(cls, stub: NotImplementedError) -> NotWritten:
        err = cls(unwritten_message(str(stub)))
        err.learner_traceback = "".join(traceback.format_tb(stub.__traceback__))
        return err

    @staticmethod
    def is_stub(exc: BaseException) -> bool:
        """A NotImplementedError raised by the learner's own code (the release's stub)."""
        return isinstance(exc, NotWritten) or (isinstance(exc, NotImplementedError) and
                                               stub_raised("".join(traceback.format_tb(
                                                   exc.__traceback__))))


# --- the one refusal mechanism ----------------------------------------------------------------

def reference_message(what: str) -> str:
    """What a refused reference says, and what a check says of a bare re-export of it."""
    return (f"your answer uses {what}, the course's own reference implementation; the exercise "
            "is to write it yourself")


def _functions(references: Iterable[object]) -> list[types.FunctionType]:
    found: list[types.FunctionType] = []
    for ref in references:
        if isinstance(ref, type):
            for value in vars(ref).values():
                value = getattr(value, "__func__", value)  # staticmethod, classmethod
                if isinstance(value, property):
                    value = value.fget
                if isinstance(value, types.FunctionType):
                    found.append(value)
        elif isinstance(ref, types.FunctionType):
            found.append(ref)
        else:
            raise TypeError(f"refused() takes functions and classes, not {type(ref).__name__}")
    return found


def _refusal_code(n_free: int, message: str) -> types.CodeType:
    """The code of `raise CheckFailed(message)` with `n_free` free variables, so it fits a
    function that has a closure (a method calling super() has one, `__class__`). It runs with
    the refused function's globals, so it imports what it raises."""
    free = [f"_free{i}" for i in range(n_free)]
    src = "def _outer():\n"
    src += f"    {' = '.join(free)} = None\n" if free else ""
    src += "    def _refused(*args, **kwargs):\n"
    src += f"        {', '.join(free)}\n" if free else ""
    src += ("        from parlab.errors import CheckFailed\n"
            f"        raise CheckFailed({message!r})\n"
            "    return _refused\n")
    namespace: dict[str, Any] = {}
    exec(compile(src, "<refused reference>", "exec"), namespace)  # noqa: S102 - our own template
    return namespace["_outer"]().__code__


@contextlib.contextmanager
def refused(references: Iterable[object], message: str) -> Iterator[None]:
    """Inside the block each function of `references` (each function a class defines) raises
    CheckFailed(message); outside it they run as written, even after an exception."""
    references = list(references)
    saved = [(fn, fn.__code__) for fn in _functions(references)]
    for fn, code in saved:
        fn.__code__ = _refusal_code(len(code.co_freevars), message)
    REFUSING.append((references, message))
    try:
        yield
    finally:
        REFUSING.pop()
        for fn, code in saved:
            fn.__code__ = code


REFUSING: list[tuple[list[object], str]] = []
"""The refusals in force here, innermost last: a call of the learner's code that runs in
another process (the verifier's stand-in, parlab.sandboxed) takes them along."""
