"""The errors of `parlab.launch.run`, each naming the rank and what it was doing.

- `RankError`: a rank raised (or died); `.rank`, `.exc_type` and `.traceback` (its traceback,
  pointing at the learner's own cells again, see `relocate`) say which and where. When every
  rank that raised on its own raised the release's stub (`.unwritten`), it reads as the
  kernel's stub does: "NotImplementedError: not written yet: ..." and the stub's line.
- `CollectiveMismatch` (a RankError): ranks called different collectives, or one with tensors
  of different shape or dtype.
- `NcclRuleBroken`: with PARLAB_NCCL_RULES=1, a call NCCL would refuse or deadlock on,
  although gloo ran it (parlab.launch.nccl_rules).
- `CollectiveTimeout`: a hang; `.certain` tells a hang seen for sure (stopped early) from one
  that merely ran out of time, `.elapsed` how long the ranks ran.

All four are `parlab.errors.Readable`: in a notebook they show the message and the learner's
own frames, not the launcher's.
"""

from __future__ import annotations

import linecache
import re
from typing import Any

from parlab.errors import Readable, stub_raised, unwritten_message

_COMM_FAILURE = ("Connection reset", "Connection closed", "Timed out waiting", "Broken pipe",
                 "ECONNRESET", "Socket closed", "Connection refused", "monitoredBarrier")
_MISMATCH = ("Detected mismatch between collectives", "mismatch between collectives")


def _compact(text: str) -> str:
    """Drop the device/layout noise torch prints in every collective fingerprint."""
    return re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\(nullopt\)\)", "", text)


Origins = dict[str, list[tuple[str, int, int]]]  # function name -> (file, first, last line)


def code_origins(*objects: Any) -> Origins:
    """Function name -> (file, first line, last line) of each function and method shipped to
    the ranks, and of those they reach through their module's globals (a class a learner's
    function calls, defined in another cell). cloudpickle renames their file "<dynamic-code>";
    with this map a rank's traceback can point at the learner's own cell again."""
    origins: Origins = {}
    todo, seen = list(objects), set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, type):
            todo.extend(v for v in vars(obj).values() if callable(v) or isinstance(v, (
                staticmethod, classmethod)))
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif hasattr(obj, "__code__"):
            todo.extend(_same_module_globals(obj))
            codes = [obj.__code__]
            while codes:
                code = codes.pop()
                lines = [ln for _, _, ln in code.co_lines() if ln is not None]
                origins.setdefault(code.co_name, []).append(
                    (code.co_filename, code.co_firstlineno, max(lines, default=0)))
                codes.extend(c for c in code.co_consts if hasattr(c, "co_filename"))
    return origins


def _same_module_globals(fn: Any) -> list[Any]:
    """The functions and classes `fn` names that live in its own (the learner's) module."""
    module = getattr(fn, "__module__", None)
    if not module or module.startswith(("parlab", "torch")):
        return []
    names = getattr(fn.__code__, "co_names", ())
    found = [fn.__globals__.get(n) for n in names]
    return [o for o in found if (isinstance(o, type) or hasattr(o, "__code__"))
            and getattr(o, "__module__", None) == module]


def relocate(tb: str, origins: Origins) -> str:
    """Put the real file and source line back into a rank's traceback."""
    def frame(m: re.Match) -> str:
        line, name = int(m.group(1)), m.group(2)
        path = next((f for f, first, last in origins.get(name, []) if first <= line <= last),
                    None)
        if path is None:
            return m.group(0)
        text = linecache.getline(path, line).strip()
        return f'File "{path}", line {line}, in {name}' + (f"\n    {text}" if text else "")

    return re.sub(r'File "<dynamic-code>", line (\d+), in (\S+)', frame, tb)


class RankError(Readable, RuntimeError):
    """A rank raised (or died). `.rank` names it, `.traceback` holds its traceback."""

    def __init__(self, message: str, *, rank: int, exc_type: str, traceback: str,
                 reports: list[tuple] | None = None, head: str = "") -> None:
        super().__init__(message)
        self.rank, self.exc_type, self.traceback = rank, exc_type, traceback
        self.learner_traceback = traceback
        self.reports = reports or []
        self.head = head or message
        if self.unwritten:  # the stub, raised on its own by every rank that raised
            self.shown_as = "NotImplementedError"
            self.head = unwritten_message(next(
                (str(r[2]) for r in self.reports if r[0] == rank), ""))

    @property
    def unwritten(self) -> bool:
        """Every rank that raised on its own (not a peer's broken connection) reached the
        learner's stub: a NotImplementedError whose innermost frame is the learner's code."""
        own = [r for r in self.reports if not _is_comm_failure(str(r[2]))]
        return self.exc_type == "NotImplementedError" and bool(own) and all(
            r[1] == "NotImplementedError" and stub_raised(str(r[3])) for r in own)

    def summary(self) -> str:
        """What the rank raised and what the others did, without the launcher's traceback."""
        return self.head

    @classmethod
    def from_reports(cls, reports: list[tuple], state: str,
                     origins: Origins | None = None) -> RankError:
        """Pick the root cause: a rank's own error beats its peers' broken connections."""
        own = [r for r in reports if not _is_comm_failure(r[2])]
        rank, ename, evalue, tb, _ = min(own or reports, key=lambda r: r[4])
        evalue, tb = _compact(evalue), relocate(_compact(tb), origins or {})
        kind = CollectiveMismatch if any(m in evalue for m in _MISMATCH) else cls
        head = (f"rank {rank} raised {ename}: {evalue}" if ename != "RankDied" else evalue)
        if kind is CollectiveMismatch:
            head = ("ranks called collectives that do not match (a different operation, or "
                    "tensors of different shape or dtype on different ranks). Every rank "
                    "must call the same collectives, in the same order, with tensors of the "
                    f"same shape.\n{head}")
        others = [f"  rank {r[0]}: {r[1]}: {_compact(r[2]).splitlines()[0][:300] if r[2] else ''}"
                  for r in reports if r[0] != rank]
        consequence = ("other ranks (most likely a consequence):\n" + "\n".join(others)
                       if others else "")
        parts = [head, f"\n--- traceback on rank {rank} ---\n{tb.rstrip()}"]
        parts += [consequence] if consequence else []
        parts.append("state of every rank:\n" + state)
        short = "\n".join([head] + ([consequence] if consequence else []))
        return kind("\n".join(parts), rank=rank, exc_type=ename, traceback=tb, reports=reports,
                    head=short)


class CollectiveMismatch(RankError):
    """Ranks disagreed on a collective: a different op, shape or dtype."""


class NcclRuleBroken(Readable, RuntimeError):
    """What NCCL would refuse or deadlock on, seen on gloo (parlab.launch.nccl_rules)."""


class CollectiveTimeout(Readable, TimeoutError):
    """The ranks did not finish in time; the message says what each was doing.

    `.certain` is True when the watch saw a hang for sure (a rank waits on ranks that have
    returned, or ranks wait on each other in a cycle) and stopped the run before `timeout`;
    `.elapsed` is how long the ranks had run."""

    def __init__(self, message: str, *, states: dict[int, dict], certain: bool = False,
                 elapsed: float = 0.0) -> None:
        super().__init__(message)
        self.states, self.certain, self.elapsed = states, certain, elapsed


def _is_comm_failure(text: str) -> bool:
    return any(m in text for m in _COMM_FAILURE)
