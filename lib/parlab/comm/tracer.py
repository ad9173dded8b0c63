"""The tracer of parlab.comm (see its docstring): the wrappers of torch.distributed's
functions, the listeners they tell, and `trace()`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from parlab.comm.bytes import payload, wire_bytes
from parlab.comm.staging import staged


@dataclass(frozen=True)
class Event:
    """One communication call as one rank saw it."""

    kind: str  # "all_reduce", "all_gather", "reduce_scatter", "send", "irecv", ...
    group_size: int  # ranks taking part (2 for point-to-point)
    nbytes: int  # payload: the full tensor for all_reduce/all_gather/reduce_scatter
    wire_bytes: float  # bytes this rank sends under a ring algorithm
    group_ranks: tuple[int, ...] = ()  # global ranks of the group (peer for p2p)
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device: str = ""  # where the tensor lives ("cpu", "cuda:0"); "" without a tensor
    batch: int = 0  # which batch_isend_irecv call posted it (NCCL groups these); 0: none
    gloo_group: bool = False  # on a group made with backend="gloo": gloo on a GPU box too
    seq: int = 0  # this rank's how-many-th such call on its group, or toward its peer (posted())

    def describe(self) -> str:
        if self.kind == "new_group":
            return f"new_group(ranks {list(self.group_ranks)})"
        peers = f" with ranks {list(self.group_ranks)}" if self.group_ranks else ""
        return f"{self.kind}(tensor {tuple(self.shape)} {self.dtype}, {self.nbytes} B){peers}"


Listener = Callable[[str, Event], None]  # (phase "start" | "end", event)
_listeners: list[Listener] = []
_originals: dict[str, Callable[..., Any]] = {}
_depth = [0]  # >0 while inside a wrapped call: all_gather_object calls all_gather itself
_batch = [0, 0]  # the batch_isend_irecv call under way (0: none), the last one's number
_gloo_groups: dict[int, Any] = {}  # id -> group, of the groups made with backend="gloo"
_posted: dict[str, int] = {}  # what this rank has posted, counted: see posted()


def posted() -> dict[str, int]:
    """How many calls this rank has posted (traced ones): collectives per group ("0,2" -> 3),
    sends per destination ("send>2"), receives per source ("recv<2"). The launcher's watch
    compares them to tell a wait that can still end from one that never will."""
    return dict(_posted)


def posted_key(kind: str, ranks: Sequence[int]) -> str | None:
    """Where posted() counts a call of `kind` on the group `ranks` (for point-to-point, the
    peer); None for calls it does not count."""
    if kind in _COLLECTIVES and ranks:
        return ",".join(map(str, ranks))
    if kind == "new_group" and ranks:  # collective over the world, one count per group made
        return "new_group:" + ",".join(map(str, ranks))
    if kind in _P2P and ranks:
        return f"send>{ranks[0]}" if kind in ("send", "isend") else f"recv<{ranks[0]}"
    return None


def _count(kind: str, ranks: tuple[int, ...]) -> int:
    """The how-many-th call of its kind on its group (or toward its peer) this one is; 0 for
    calls that are not counted."""
    key = posted_key(kind, ranks)
    if key is None:
        return 0
    _posted[key] = _posted.get(key, 0) + 1
    return _posted[key]


def _group_ranks(group: Any) -> tuple[int, ...]:
    if not dist.is_initialized():
        return ()
    if group is None or group is dist.GroupMember.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


_COLLECTIVES = [
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier",
    "all_gather_object", "broadcast_object_list",
]
_P2P = ["send", "recv", "isend", "irecv"]  # batch_isend_irecv calls isend/irecv
_SETUP = ["new_group"]  # collective over the whole world; seen by the launcher, not traced
_p2p_group: list[Any] = []  # a copy of the world that default-group send/recv go through


def route_p2p(group: Any) -> None:
    """Send point-to-point calls made on the default group through `group`, a copy of the world
    with the same rank numbers (the launcher sets it in TORCH_DISTRIBUTED_DEBUG=DETAIL mode).

    DETAIL checks each collective against the other ranks' by sequence number, and a group's
    sequence counts its point-to-point calls too. In a pipeline the end stages send fewer
    messages than the middle ones, so a correct all-reduce after it looked mismatched; on a
    group of their own the messages leave the default group's count alone."""
    _p2p_group[:] = [group]


def _rerouted(kind: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """args, kwargs of a p2p call (or batch_isend_irecv) with the default group replaced."""
    if not _p2p_group:
        return args, kwargs
    world = (None, dist.GroupMember.WORLD)
    if kind == "batch_isend_irecv":
        for op in args[0] if args else kwargs.get("p2p_op_list", []):
            if op.group in world:
                op.group = _p2p_group[0]
        return args, kwargs
    if len(args) > 2:  # send(tensor, dst, group, tag): the group given by position
        if args[2] in world:
            args = (*args[:2], _p2p_group[0], *args[3:])
    elif kwargs.get("group") in world:
        kwargs = {**kwargs, "group": _p2p_group[0]}
    return args, kwargs


def _peer(args: tuple, kwargs: dict) -> tuple[int, ...]:
    """The global rank at the other end of a send/recv (empty for recv from anyone)."""
    for key in ("dst", "src"):
        if kwargs.get(key) is not None:
            return (int(kwargs[key]),)
    for key in ("group_dst", "group_src"):  # how batch_isend_irecv calls isend/irecv
        if kwargs.get(key) is not None:
            group = kwargs.get("group")
            if group is None or group is dist.GroupMember.WORLD:
                return (int(kwargs[key]),)
            return (dist.get_global_rank(group, int(kwargs[key])),)
    return (int(args[1]),) if len(args) > 1 and args[1] is not None else ()


def _make_event(kind: str, args: tuple, kwargs: dict) -> Event:
    if kind == "new_group":
        given = args[0] if args else kwargs.get("ranks")
        members = tuple(given) if given else tuple(range(dist.get_world_size()))
        return Event(kind, len(members), 0, 0.0, members, seq=_count(kind, members))
    tensor, n = payload(kind, args, kwargs)
    ranks: tuple[int, ...]
    if kind in _P2P:
        ranks = _peer(args, kwargs)
        size = 2
    else:
        ranks = _group_ranks(kwargs.get("group"))
        size = len(ranks) or 1
    wire = wire_bytes(kind, n, size)
    splits = kwargs.get("input_split_sizes", args[3] if len(args) > 3 else None)
    if kind == "all_to_all_single" and splits and tensor is not None and ranks:
        # uneven split: everything but the rows this rank keeps for itself leaves it
        row_bytes = n // max(1, tensor.shape[0])
        wire = float(n - splits[ranks.index(dist.get_rank())] * row_bytes)
    shape = tuple(tensor.shape) if tensor is not None else ()
    dtype = str(tensor.dtype).replace("torch.", "") if tensor is not None else ""
    device = str(tensor.device) if tensor is not None else ""
    group = kwargs.get("group", args[2] if kind in _P2P and len(args) > 2 else None)
    return Event(kind, size, n, wire, ranks, shape, dtype, device, _batch[0],
                 id(group) in _gloo_groups, _count(kind, ranks))


def _notify(phase: str, event: Event) -> None:
    for listener in list(_listeners):
        listener(phase, event)


class _TracedWork:
    """Wraps the handle of an isend/irecv or of an async collective, so that waiting on it is
    seen too."""

    def __init__(self, work: Any, event: Event) -> None:
        self._work, self._event = work, event

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        waiting = dataclasses.replace(self._event, kind=f"wait({self._event.kind})")
        _notify("start", waiting)
        out = self._work.wait(*args, **kwargs)
        _notify("end", waiting)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _wrap(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kind in _P2P or kind == "batch_isend_irecv":
            args, kwargs = _rerouted(kind, args, kwargs)
        # not traced: batch_isend_irecv (its isend/irecv calls are), a call nobody watches, or
        # one made by another wrapped call (all_gather_object calls all_gather itself)
        if kind == "batch_isend_irecv":
            _batch[1] += 1
            _batch[0] = _batch[1]
            try:
                return fn(*args, **kwargs)
            finally:
                _batch[0] = 0
        call = staged(kind, fn)  # fn, or fn on host copies where gloo has the GPU's tensors
        if not _listeners or _depth[0]:
            return call(*args, **kwargs)
        event = _make_event(kind, args, kwargs)
        _notify("start", event)
        _depth[0] += 1
        try:
            out = call(*args, **kwargs)
        finally:
            _depth[0] -= 1
        _notify("end", event)
        if kind == "new_group" and kwargs.get("backend", args[2] if len(args) > 2 else None) \
                == "gloo" and out is not None:
            _gloo_groups[id(out)] = out
        if out is not None and (kind in ("isend", "irecv") or (
                kind in _COLLECTIVES and callable(getattr(out, "wait", None)))):
            return _TracedWork(out, event)  # async_op=True: its wait is seen too
        return out

    wrapper.__parlab_original__ = fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Wrap torch.distributed's communication functions once (idempotent)."""
    if _originals:
        return
    for kind in _COLLECTIVES + _P2P + _SETUP + ["batch_isend_irecv"]:
        fn = getattr(c10d, kind, None)
        if fn is not None:
            _originals[kind] = fn
            wrapped = _wrap(kind, fn)
            # Both names: `dist.isend` for callers, the module global for P2POp's own check
            # and for batch_isend_irecv, which calls it.
            setattr(dist, kind, wrapped)
            setattr(c10d, kind, wrapped)


def add_listener(listener: Listener) -> None:
    """Call `listener(phase, event)` at the start and end of every communication call."""
    install()
    _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


@dataclass
class Trace:
    """What one rank sent while a `trace()` block was open."""

    events: list[Event] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def count(self, kind: str | None = None) -> int:
        return len(self.events if kind is None else self.of(kind))

    def wire_bytes(self, kind: str | None = None) -> float:
        """Bytes this rank sent, under ring algorithms (optionally for one kind only)."""
        return sum(e.wire_bytes for e in (self.events if kind is None else self.of(kind)))

    def summary(self) -> str:
        lines = [f"{e.describe()}: {e.wire_bytes:,.0f} B on the wire" for e in self.events]
        return "\n".join(lines + [f"total: {self.wire_bytes():,.0f} B sent by this rank"])


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every communication call this process makes inside the block."""
    record = Trace()

    def listener(phase: str, event: Event) -> None:
        if phase == "end" and not event.kind.startswith("wait(") and event.kind not in _SETUP:
            record.events.append(event)

    add_listener(listener)
    try:
        yield record
    finally:
        remove_listener(listener)
