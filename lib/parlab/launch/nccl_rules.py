"""NCCL's rules, checked on gloo: what runs on a laptop must not deadlock on a GPU box.

With `PARLAB_NCCL_RULES=1`, every rank of `parlab.launch.run` records its communication calls
(`Recorder`, a listener of parlab.comm), and the run fails with `NcclRuleBroken` where NCCL
would refuse or deadlock although gloo did not. Exempt: a run that asks for gloo
(`backend="gloo"` or PARLAB_BACKEND=gloo) and a group made with `backend="gloo"`, which stay
gloo on a GPU box.

1. A collective's (or send's) tensor is not on the rank's device (`parlab.launch.device()`):
   NCCL takes CUDA tensors only. Raised in the rank, at the call.
2. Per pair of ranks, the point-to-point calls must pair up in order. NCCL runs the sends
   and receives between two ranks one after another, in the order they were posted (one
   stream per pair); the calls of one `dist.batch_isend_irecv` run together. So rank a's
   calls with rank b, taken in order (a batch as one step), must each find their match in
   b's current step: two ranks that both receive first wait for ever (a 2-rank ring that
   posts irecv before isend: left and right are the same peer), as do two pipeline stages
   that both send first. Checked by the parent when every rank has returned
   (`check_pairs`, which plays the pair's two queues against each other).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from parlab import comm
from parlab.comm import tracer
from parlab.launch import devices
from parlab.launch.errors import NcclRuleBroken

__all__ = ["enabled", "watching", "Recorder", "Call", "check_pairs"]
_SENDS, _RECVS = ("send", "isend"), ("recv", "irecv")
_NO_TENSOR = ("barrier", "new_group", "all_gather_object", "broadcast_object_list")
_FIX = ("post the two together with dist.batch_isend_irecv([dist.P2POp(dist.isend, x, right), "
        "dist.P2POp(dist.irecv, buf, left)]), or let even ranks send first and odd ranks "
        "receive first")


def enabled() -> bool:
    return os.environ.get("PARLAB_NCCL_RULES", "").strip() not in ("", "0")


@dataclass(frozen=True)
class Call:
    """One point-to-point call, as the rules need it."""

    peer: int
    kind: str  # send, isend, recv, irecv
    shape: tuple[int, ...]
    dtype: str
    where: tuple[str, int, str]  # (file, line, function) of the call in the caller's code
    batch: int = 0  # its batch_isend_irecv call (0: none)

    @property
    def sends(self) -> bool:
        return self.kind in _SENDS

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        file, line, name = self.where
        batch = " in a batch_isend_irecv" if self.batch else ""
        return (f"{self.kind}(tensor {self.shape} {self.dtype}){batch} "
                f'at File "{file}", line {line}, in {name}')


_PLUMBING = (tracer.__file__, __file__)
_WATCHING: list[Recorder] = []  # the recorder of this rank, once there is one


def _where() -> tuple[str, int, str]:
    """The first frame outside torch and the launcher's plumbing: the caller's own call."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (f"{os.sep}torch{os.sep}" in path or path in _PLUMBING):
            return path, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return "?", 0, "?"


def watching() -> bool:
    """Whether this rank runs under the rules: code that picks what it would do under NCCL
    (parlab.compose.grid's gloo group for pipeline messages) does it then, on gloo too."""
    return bool(_WATCHING)


class Recorder:
    """A parlab.comm listener: checks rule 1 at each call, logs the calls rule 2 needs."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        _WATCHING[:] = [self]

    def __call__(self, phase: str, event: comm.Event) -> None:
        if (phase != "start" or event.kind.startswith("wait(") or event.kind in _NO_TENSOR
                or event.gloo_group):  # a group made with backend="gloo" stays gloo
            return
        want = devices.device()
        if event.device and event.device != str(want):
            raise NcclRuleBroken(
                f"{event.kind} was given a tensor on {event.device}, but this rank's device "
                f"is {want}: NCCL takes tensors on the rank's GPU only (PARLAB_NCCL_RULES=1 "
                "checks this on gloo).\nLikely mistake: the tensor was made without "
                "device=parlab.launch.device() (or moved back with .cpu()); make it there")
        if event.kind in _SENDS + _RECVS and event.group_ranks:
            self.calls.append(Call(event.group_ranks[0], event.kind, event.shape, event.dtype,
                                   _where(), event.batch))


def _steps(calls: list[Call]) -> list[list[Call]]:
    """The calls as NCCL runs them on one pair: each alone, a batch's together."""
    steps: list[list[Call]] = []
    for call in calls:
        if call.batch and steps and steps[-1][0].batch == call.batch:
            steps[-1].append(call)
        else:
            steps.append([call])
    return steps


def _first_break(a: int, mine: list[Call], b: int, theirs: list[Call]) -> str | None:
    """Play the two ranks' steps: a step is done when each of its calls has met its match
    (send with receive, in order each way) in the other rank's current step."""
    ours, peers = _steps(mine), _steps(theirs)
    i = j = 0
    left, right = list(ours[0]) if ours else [], list(peers[0]) if peers else []
    while True:
        matched = False
        for sends in (True, False):  # a's first send meets b's first receive, and back
            x = next((c for c in left if c.sends == sends), None)
            y = next((c for c in right if c.sends != sends), None)
            if x is None or y is None:
                continue
            if x.numel != y.numel or x.dtype != y.dtype:
                return (f"ranks {a} and {b} send and receive different sizes:\n  rank {a}: "
                        f"{x.describe()}\n  rank {b}: {y.describe()}\nLikely mistake: the "
                        "receive buffer must have the sent tensor's shape and dtype")
            left.remove(x)
            right.remove(y)
            matched = True
        if not left and i < len(ours):
            i += 1
            left, matched = (list(ours[i]) if i < len(ours) else []), True
        if not right and j < len(peers):
            j += 1
            right, matched = (list(peers[j]) if j < len(peers) else []), True
        if i >= len(ours) and j >= len(peers):
            return None
        if not matched:
            return _deadlock(a, left, b, right)


def _deadlock(a: int, left: list[Call], b: int, right: list[Call]) -> str:
    if not left or not right:
        more, rest = (a, left) if left else (b, right)
        other = b if more == a else a
        return (f"rank {more} makes a point-to-point call with rank {other} that rank "
                f"{other} never matches: {rest[0].describe()}. Under NCCL it waits for ever."
                "\nLikely mistake: every send needs the peer's receive (and every receive a "
                "send), the same number on both sides")
    both = "send" if left[0].sends and right[0].sends else "receive"
    return (f"NCCL would deadlock here: ranks {a} and {b} both {both} first.\n"
            f"  rank {a}: {left[0].describe()}\n  rank {b}: {right[0].describe()}\n"
            "Under NCCL the sends and receives between two ranks run in the order posted, "
            f"so each waits in its {both} for the other (gloo let it pass).\nLikely mistake: "
            f"with 2 ranks, the left and right neighbour are the same rank; {_FIX}")


def check_pairs(calls: list[list[Call]]) -> None:
    """Rule 2 over every rank's log (`calls[r]`: rank r's); raises NcclRuleBroken."""
    for a in range(len(calls)):
        for b in range(a + 1, len(calls)):
            why = _first_break(a, [c for c in calls[a] if c.peer == b], b,
                               [c for c in calls[b] if c.peer == a])
            if why is not None:
                raise NcclRuleBroken(why)
