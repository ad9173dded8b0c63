"""The watch that turns a hang of `parlab.launch.run` into an explanation.

Each rank publishes a JSON status line (see `parlab.launch.rank`): starting, running, in a call,
after a call, returned, raised. The parent reads them to say what every rank was doing when
a run timed out, and to stop early when a hang is certain: a rank has sat in a call for a
while and every other rank of that call has already returned, so nobody will ever join it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from parlab.comm import posted_key
from parlab.launch.errors import CollectiveTimeout

STARTUP_S = 60.0  # joining the group and unpickling fn (which imports its module) is not
# counted in `timeout`; it has a bound of its own
SURE_HANG_S = 1.0  # a call that waits this long for ranks that have all returned is a hang
P2P_CYCLE_S = 3.0  # ranks waiting on each other's send/recv in a cycle this long: deadlock
# (a transfer already posted with isend finishes in milliseconds on one machine)
_OTHER = {"recv": "send", "send": "recv"}


def _stuck_line(rank: int, s: dict, peer: int, n: int) -> str:
    if _call(s) == "new_group":  # collective over the world: every rank makes every group
        return (f"rank {rank} waits in {s['what']} (its call #{s['seq']} for that group; rank "
                f"{peer} has made {n})")
    if s.get("p2p"):
        return (f"rank {rank} waits to receive message #{s['seq']} from rank {peer}, which has "
                f"sent it {n}")
    return (f"rank {rank} waits in {_call(s)} over ranks {s['group']} (its collective "
            f"#{s['seq']} on that group; rank {peer} has made {n} there)")


def _call(state: dict) -> str:
    """The collective a status line waits in: "all_reduce" for a wait on an async one too."""
    return str(state.get("kind", "a call")).replace("wait(", "").rstrip(")")


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

    def brief(self, results: dict[int, Any]) -> str:
        """What the ranks that have not returned are doing, in a few words, ranks grouped
        ("ranks 0, 2: in all_reduce; rank 1: its own code")."""
        doing: dict[str, list[int]] = {}
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            if rank in results or s["state"] == "returned":
                continue
            text = {"in": f"in {s.get('what', 'a call')}", "after": "its own code",
                    "running": "its own code", "raised": "raised"}.get(s["state"], "starting")
            doing.setdefault(text, []).append(rank)
        return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {text}"
                         for text, r in doing.items())

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
        return (self._p2p_cycle(now) or self._collectives_stuck(now, results)
                or self._crossed_groups(now, results))

    def _crossed_groups(self, now: float, results: dict[int, Any]) -> str | None:
        """Every rank still running waits, and the ranks have made different groups: one made
        a group that another, having made as many groups or more, never made. new_group is
        collective over the world, so every rank's groups are the same list in the same order
        and the groups made so far by the rank that made fewer are among the other's; crossed,
        the groups are wired wrongly (torch names a group by a count of the groups made) and
        the waits on them never end, whatever the counts of their collectives say."""
        made: dict[int, dict[str, int]] = {}
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            if rank not in results and s.get("state") != "returned" and (
                    s.get("state") != "in" or now - s.get("t", now) < SURE_HANG_S):
                return None  # someone runs, or only just began to wait
            made[rank] = {k: n for k, n in s.get("posted", {}).items()
                          if k.startswith("new_group:")}
        for r, mine in made.items():
            for q, theirs in made.items():
                if sum(mine.values()) <= sum(theirs.values()):
                    missing = [k for k, n in mine.items() if theirs.get(k, 0) < n]
                    if missing:
                        group = "[" + missing[0].removeprefix("new_group:").replace(",", ", ")
                        return (f"deadlock: rank {r} made the group {group}], which rank {q} "
                                f"never made, though rank {q} made {sum(theirs.values())} "
                                f"groups to rank {r}'s {sum(mine.values())}: the ranks made "
                                "different groups, and the waits on them never end")
        return None

    def _p2p_cycle(self, now: float) -> str | None:
        """Ranks that each wait to receive from the next (or each wait to send to the next)
        around a cycle: nobody can move, so this is a deadlock."""
        waits: dict[int, tuple[str, int]] = {}  # rank -> (direction, peer)
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            kind = _call(s)
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

    def _posted(self, rank: int, kind: str, ranks: list[int]) -> int:
        """How many calls of `kind` on `ranks` (or toward that peer) `rank` has posted."""
        return self.state(rank).get("posted", {}).get(posted_key(kind, ranks), 0)

    def _collectives_stuck(self, now: float, results: dict[int, Any]) -> str | None:
        """Every rank still running waits (for a while) in a collective or a receive that a
        rank it needs has not posted: a member of the group has made fewer collectives on it,
        or the peer has sent fewer messages to it. That rank is itself stuck, or has
        returned, so nobody can move. (A wait in a send is not judged: gloo may complete a
        send before its receive is posted.)"""
        missing: dict[int, tuple[dict, int, int]] = {}  # rank -> (its state, whom, their count)
        for rank in range(len(self.statuses)):
            s = self.state(rank)
            if rank in results or s.get("state") == "returned":
                continue
            if s.get("state") != "in" or not s.get("seq") or now - s.get("t", now) < SURE_HANG_S:
                return None  # someone runs, or waits on something this rule cannot judge
            if all(p in results or self.state(p).get("state") == "returned"
                   for p in s["group"] if p != rank):
                return None  # every peer returned: _sure_hang says so, once they have been
                # gone SURE_HANG_S (a slow rank may return after the others began to wait)
            if s.get("p2p"):
                if _call(s) not in ("recv", "irecv"):
                    return None
                peer = s["group"][0]  # its sends to this rank, against this receive
                need = [(peer, self._posted(peer, "send", [rank]))]
            else:  # a new_group's count is kept by the group it makes ("members")
                need = [(peer, self._posted(peer, _call(s), s.get("members", s["group"])))
                        for peer in s["group"] if peer != rank]
            behind = [(peer, n) for peer, n in need if n < s["seq"]]
            if not behind:
                return None  # this wait can end
            missing[rank] = (s, *behind[0])
        if all(s.get("p2p") for s, _, _ in missing.values()):
            return None  # messages only: the cycle rule (_p2p_cycle) says it better
        # a rank stuck making a group first: the others wait on it
        order = sorted(missing, key=lambda r: (_call(missing[r][0]) != "new_group", r))
        lines = [_stuck_line(r, *missing[r]) for r in order]
        said = "; ".join(lines[:2]) + (f"; and {len(lines) - 2} more ranks (below)"
                                       if len(lines) > 2 else "")
        made = any(_call(s) == "new_group" for s, _, _ in missing.values())
        return (f"deadlock: {said}. Each waits for a call another rank never makes (the ranks "
                + ("create different groups, or " if made else "")
                + "call collectives over different groups, or a different number of times)")

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
                            results, certain=False)
            return
        elapsed = now - self.all_running_at
        reason = self._sure_hang(results)
        if reason is None and elapsed <= self.timeout:
            return
        certain = reason is not None
        if reason is None:
            reason = (f"no result within timeout={self.timeout:g} s. Likely causes: ranks "
                      "that wait for each other (a collective or a recv that some rank never "
                      "reaches), or an endless loop")
            if any(self.state(r).get("kind") == "new_group" for r in range(len(self.statuses))):
                reason += (". dist.new_group is collective over the whole world: every rank "
                           "must create every group, in the same order, even those it is not in")
        self._raise(elapsed, reason, results, certain=certain)

    def _raise(self, elapsed: float, reason: str, results: dict[int, Any], *,
               certain: bool) -> None:
        states = {r: self.state(r) for r in range(len(self.statuses))}
        if certain and elapsed < self.timeout - 0.5:
            when = (f"stopped early, after {elapsed:.1f} s of its {self.timeout:g} s timeout, "
                    "because the hang is certain")
        elif certain:  # a rule that needs a few seconds of waiting fired at the timeout
            when = (f"stopped at its {self.timeout:g} s timeout, after {elapsed:.1f} s; by then "
                    "the hang was certain")
        else:
            when = f"stopped after {elapsed:.1f} s"
        raise CollectiveTimeout(f"run() {when}: {reason}.\n"
                                f"What each rank was doing:\n{self.describe(results)}",
                                states=states, certain=certain, elapsed=elapsed)
