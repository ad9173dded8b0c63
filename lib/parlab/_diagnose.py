"""Errors of `parlab.launch.run`, and the watch that turns a hang into an explanation.

Each rank publishes a JSON status line (see `parlab._rank`): starting, running, in a call,
after a call, returned, raised. The parent reads them to say what every rank was doing when
a run timed out, and to stop early when a hang is certain: a rank has sat in a call for a
while and every other rank of that call has already returned, so nobody will ever join it.
"""

from __future__ import annotations

import json
import linecache
import re
import time
from typing import Any

STARTUP_S = 60.0  # joining the group and unpickling fn (which imports its module) is not
# counted in `timeout`; it has a bound of its own
SURE_HANG_S = 1.0  # a call that waits this long for ranks that have all returned is a hang
P2P_CYCLE_S = 3.0  # ranks waiting on each other's send/recv in a cycle this long: deadlock
# (a transfer already posted with isend finishes in milliseconds on one machine)
_OTHER = {"recv": "send", "send": "recv"}
_COMM_FAILURE = ("Connection reset", "Connection closed", "Timed out waiting", "Broken pipe",
                 "ECONNRESET", "Socket closed", "Connection refused", "monitoredBarrier")
_MISMATCH = ("Detected mismatch between collectives", "mismatch between collectives")


def _compact(text: str) -> str:
    """Drop the device/layout noise torch prints in every collective fingerprint."""
    return re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\(nullopt\)\)", "", text)


def code_origins(*objects: Any) -> dict[str, str]:
    """Function name -> file it was defined in, for the functions and classes shipped to
    the ranks. cloudpickle renames their file "<dynamic-code>"; with this map a rank's
    traceback can point at the learner's own cell again."""
    origins: dict[str, str] = {}
    todo = list(objects)
    while todo:
        obj = todo.pop()
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
            codes = [obj.__code__]
            while codes:
                code = codes.pop()
                origins.setdefault(code.co_name, code.co_filename)
                codes.extend(c for c in code.co_consts if hasattr(c, "co_filename"))
    return origins


def relocate(tb: str, origins: dict[str, str]) -> str:
    """Put the real file and source line back into a rank's traceback."""
    def frame(m: re.Match) -> str:
        line, name = int(m.group(1)), m.group(2)
        path = origins.get(name)
        if path is None:
            return m.group(0)
        text = linecache.getline(path, line).strip()
        return f'File "{path}", line {line}, in {name}' + (f"\n    {text}" if text else "")

    return re.sub(r'File "<dynamic-code>", line (\d+), in (\S+)', frame, tb)


class RankError(RuntimeError):
    """A rank raised (or died). `.rank` names it, `.traceback` holds its traceback."""

    def __init__(self, message: str, *, rank: int, exc_type: str, traceback: str,
                 reports: list[tuple] | None = None) -> None:
        super().__init__(message)
        self.rank, self.exc_type, self.traceback = rank, exc_type, traceback
        self.reports = reports or []

    @classmethod
    def from_reports(cls, reports: list[tuple], state: str,
                     origins: dict[str, str] | None = None) -> RankError:
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
        parts = [head, f"\n--- traceback on rank {rank} ---\n{tb.rstrip()}"]
        if others:
            parts.append("other ranks (most likely a consequence):\n" + "\n".join(others))
        parts.append("state of every rank:\n" + state)
        return kind("\n".join(parts), rank=rank, exc_type=ename, traceback=tb, reports=reports)


class CollectiveMismatch(RankError):
    """Ranks disagreed on a collective: a different op, shape or dtype."""


class CollectiveTimeout(TimeoutError):
    """The ranks did not finish in time; the message says what each was doing."""

    def __init__(self, message: str, *, states: dict[int, dict]) -> None:
        super().__init__(message)
        self.states = states


def _is_comm_failure(text: str) -> bool:
    return any(m in text for m in _COMM_FAILURE)


class Watch:
    """Reads the ranks' status lines; raises CollectiveTimeout on a timeout or a sure hang."""

    def __init__(self, statuses: list[Any], timeout: float) -> None:
        self.statuses, self.timeout = statuses, timeout
        self.started = time.monotonic()
        self.all_running_at: float | None = None  # when the last rank started running fn

    def state(self, rank: int) -> dict:
        raw = bytes(self.statuses[rank].raw).split(b"\0", 1)[0]
        try:
            return json.loads(raw) if raw else {"state": "starting"}
        except ValueError:  # caught mid-write: ask again next time
            return {"state": "unknown"}

    def describe(self, results: dict[int, Any]) -> str:
        now = time.time()
        lines = []
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            ago = now - s.get("t", now)
            if rank in results or s["state"] == "returned":
                text = "returned its result"
            elif s["state"] == "in":
                text = f"waiting in {s['what']} for {ago:.1f} s (its call #{s['call']})"
            elif s["state"] == "after":
                text = (f"running its own code; last call {s['what']} (#{s['call']}) "
                        f"finished {ago:.1f} s ago")
            elif s["state"] == "running":
                text = f"running its own code for {ago:.1f} s, no communication call yet"
            elif s["state"] == "raised":
                text = f"raised {s.get('what', 'an exception')}"
            else:
                text = "starting (not yet in the process group)"
            lines.append(f"  rank {rank}: {text}")
        return "\n".join(lines)

    def _sure_hang(self, results: dict[int, Any]) -> str | None:
        now = time.time()
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            if s.get("state") != "in" or now - s.get("t", now) < SURE_HANG_S:
                continue
            peers = [r for r in s.get("group", []) if r != rank]
            # the peers returned a while ago, not just now: a wait their last call satisfied
            # may not have noticed yet (a slow rank's recv completing our isend)
            if peers and all(r in results and now - self.state(r).get("t", now) >= SURE_HANG_S
                             for r in peers):
                hint = ("some rank skipped a collective that the others made" if not
                        s.get("p2p") else "its peer never made the matching send/recv, or "
                        "returned without calling .wait() on its isend/irecv request (an "
                        "unwaited request may never be delivered)")
                return (f"rank {rank} waits in {s['what']}, but rank(s) {peers} already "
                        f"returned without making the matching call: {hint}")
        return self._p2p_cycle(now)

    def _p2p_cycle(self, now: float) -> str | None:
        """Ranks that each wait to receive from the next (or each wait to send to the next)
        around a cycle: nobody can move, so this is a deadlock."""
        waits: dict[int, tuple[str, int]] = {}  # rank -> (direction, peer)
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            kind = s.get("kind", "").replace("wait(", "").rstrip(")")
            if (s.get("state") == "in" and s.get("p2p") and len(s.get("group", [])) == 1
                    and now - s.get("t", now) >= P2P_CYCLE_S):
                waits[rank] = ("recv" if kind in ("recv", "irecv") else "send", s["group"][0])
        for start, (direction, _) in waits.items():
            path, rank = [start], waits[start][1]
            while rank in waits and waits[rank][0] == direction and rank not in path:
                path.append(rank)
                rank = waits[rank][1]
            if rank == start and len(path) > 1:
                ring = " -> ".join(str(r) for r in path + [start])
                verb = "receive from" if direction == "recv" else "send to"
                return (f"deadlock: ranks {ring} each wait to {verb} the next one, so none "
                        f"of them gets to the matching {_OTHER[direction]}. "
                        "Post the receive before blocking on the send (irecv + isend, then "
                        "wait), or let even and odd ranks go in opposite orders")
        return None

    def check(self, results: dict[int, Any], errors: list) -> None:
        if errors:
            return
        now = time.monotonic()
        if self.all_running_at is None:
            if all(self.state(r).get("state") != "starting" for r in range(len(self.statuses))):
                self.all_running_at = now
            elif now - self.started > STARTUP_S:
                self._raise(now - self.started, f"the ranks did not start within {STARTUP_S:g} s "
                            "(joining the process group and importing the function's module)",
                            results)
            return
        elapsed = now - self.all_running_at
        reason = self._sure_hang(results)
        if reason is None and elapsed <= self.timeout:
            return
        if reason is None:
            reason = (f"no result within timeout={self.timeout:g} s. Likely causes: ranks "
                      "that wait for each other (a collective or a recv that some rank never "
                      "reaches), or an endless loop")
            if any(self.state(r).get("kind") == "new_group" for r in range(len(self.statuses))):
                reason += (". dist.new_group is collective over the whole world: every rank "
                           "must create every group, in the same order, even those it is not in")
        self._raise(elapsed, reason, results)

    def _raise(self, elapsed: float, reason: str, results: dict[int, Any]) -> None:
        states = {r: self.state(r) for r in range(len(self.statuses))}
        raise CollectiveTimeout(f"run() stopped after {elapsed:.1f} s: {reason}.\n"
                                f"What each rank was doing:\n{self.describe(results)}",
                                states=states)
