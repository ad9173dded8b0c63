r"""What module 05's ring checks do inside the ranks, and how they read what happened.

`Recorder` watches the learner's ring from outside, around one call: every communication
call through `parlab.comm` (its listener hears each call before it is made), and every
matrix product through a `TorchFunctionMode` (`@`, matmul, bmm, einsum, the fused attention
kernels), whichever function computed it. Before a point-to-point call is made it must go
to the right neighbour (send to (r + 1) % W, receive from (r - 1) % W) with a tensor of K's
shape and dtype: gloo cannot exchange tensors of different sizes (the receiving process
aborts and its peer reads "Connection reset by peer"), and a receive from the rank one sends
to never completes on 3 or more ranks, so both are reported, by name, before the exchange.

`overlap(events)` counts the compute phases (matrix products between two communication
calls) that ran with no receive in flight; `check_protocol` reads the events after the run.
`call_ring` is the call both ring checks make on each rank: recorded, parlab's ring refused,
the inputs compared after it, the result's arity checked.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode

from parlab.check._compare import assert_unchanged, fail
from parlab.check._harness import call_learner, cpu, env
from parlab.check.cp.common import INPUTS, NEIGHBOURS, P2P_ONLY, RingCase
from parlab.cp import ring

__all__ = ["env", "cpu", "Recorder", "overlap", "check_protocol", "check_unchanged", "call_ring",
           "REFUSED", "RING_REFUSED", "SHAPES"]

REFUSED = [ring.ring_attention_forward, ring.ring_attention_backward]
RING_REFUSED = "parlab.cp.ring_attention_forward / backward"
SHAPES = "q, k and v are (B, H, n, D), this rank's n tokens; pos is (W, n), every rank's"
_P2P = ("send", "recv", "isend", "irecv")
_COMPUTE = ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm",
            "einsum", "dot", "scaled_dot_product_attention")
BUFFER = ("receive into a buffer made like the tensor that is sent: torch.empty_like(k) "
          "(torch.empty(shape) is float32 whatever k's dtype)")


def check_unchanged(before: dict[str, Tensor], after: dict[str, Tensor], *, where: str,
                    rank: int) -> None:
    """The learner's call left every input as it was given."""
    for name, kept in before.items():
        assert_unchanged(kept, after[name], name=f"{name} ({where})", rank=rank, hint=INPUTS)


class _ComputeWatch(TorchFunctionMode):
    """Tells `hear()` about every matrix product: `@`, torch.matmul, bmm, einsum, SDPA and the
    aten ops called directly (a function mode costs no import; a dispatch mode's first use
    imports torch._dynamo, seconds of a rank's time)."""

    def __init__(self, hear: Any) -> None:
        super().__init__()
        self.hear = hear

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "").split(".")[0]
        if name in _COMPUTE or name.startswith("_scaled_dot_product"):
            self.hear()
        return func(*args, **(kwargs or {}))


class Recorder:
    """Every communication call and compute phase of this rank inside the `with` block, in
    order: ("post", kind, peer, bytes), ("wait", kind) and ("compute",) in `.events`; a
    point-to-point call to the wrong neighbour or with a tensor unlike `like` fails first."""

    def __init__(self, like: Tensor, *, where: str, what: str) -> None:
        import torch.distributed as dist

        self.events: list[tuple] = []
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.shape, self.dtype = tuple(like.shape), str(like.dtype).replace("torch.", "")
        self.sent: list[int] = []  # elements of each message posted to the right, in order
        self.received: list[int] = []  # ... and from the left
        self.where, self.what = where, what
        self._mode = _ComputeWatch(self._compute)

    def _compute(self) -> None:
        if not self.events or self.events[-1][0] != "compute":
            self.events.append(("compute",))

    def _guard(self, event: Any) -> None:
        where, rank, world = f"{self.where}: {self.what}", self.rank, self.world
        if event.kind not in _P2P:
            fail(f"{where} called dist.{event.kind}", rank=rank, hint=P2P_ONLY)
        sends = event.kind in ("send", "isend")
        want = (rank + 1) % world if sends else (rank - 1) % world
        peer = event.group_ranks[0] if event.group_ranks else None
        if peer != want:
            fail(f"{where} posted dist.{event.kind} {'to' if sends else 'from'} rank {peer}; "
                 f"the blocks travel from rank r to rank r + 1, so rank {rank} sends to "
                 f"{(rank + 1) % world} and receives from {(rank - 1) % world}. (On 2 ranks "
                 "both neighbours are one rank, which is why this shows from 3 ranks on.)",
                 rank=rank, hint=NEIGHBOURS)
        self._buffer(event, sends, peer)

    def _buffer(self, event: Any, sends: bool, peer: int | None) -> None:
        """A message holds K's dtype and one to four blocks' worth of elements (a block, or
        blocks packed together: K and V, their accumulators); its size equals that of the
        message this rank posts the other way at the same place in its order (what gloo
        needs: a sender and its receiver agree on the size). Stopped before the exchange."""
        where, rank = f"{self.where}: {self.what}", self.rank
        n, block = math.prod(event.shape), math.prod(self.shape)
        said = (f"{where} called dist.{event.kind} with rank {peer} on a {event.dtype} tensor "
                f"of shape {tuple(event.shape)}")
        if event.dtype != self.dtype:
            fail(f"{said}, but the blocks are {self.dtype} (K's dtype). Stopped before the "
                 "exchange", rank=rank, hint=BUFFER)
        if n == 0 or n % block or n // block > 4:
            fail(f"{said}: not a whole number of blocks of shape {self.shape} (K's), one to "
                 "four of them. Stopped before the exchange", rank=rank,
                 hint="send K's blocks (or K, V and their accumulators packed together); "
                      "receive into a buffer made from them, torch.empty_like(k): the batch, "
                      "heads, tokens per rank and head size change from case to case, so "
                      "never write them in")
        mine, theirs = (self.sent, self.received) if sends else (self.received, self.sent)
        mine.append(n)
        if len(mine) <= len(theirs) and theirs[len(mine) - 1] != n:
            other = theirs[len(mine) - 1]
            fail(f"{said} ({n // block} block(s)) as its message #{len(mine)} that way, but "
                 f"its message #{len(mine)} the other way holds {other // block}: a sender "
                 "and its receiver must agree on the size (gloo aborts the receiving process "
                 "and its peer reads 'Connection reset by peer'). Stopped before the exchange",
                 rank=rank, hint="receive into a buffer shaped like what is sent: if you "
                 "pack blocks together to send them, receive the packed shape too")

    def _comm(self, phase: str, event: Any) -> None:
        if phase != "start":
            return
        if event.kind.startswith("wait("):
            self.events.append(("wait", event.kind[5:-1]))
            return
        self._guard(event)
        peer = event.group_ranks[0] if event.group_ranks else -1
        self.events.append(("post", event.kind, peer, event.wire_bytes))

    def __enter__(self) -> Recorder:
        from parlab import comm

        comm.add_listener(self._comm)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        from parlab import comm

        self._mode.__exit__(*exc)
        comm.remove_listener(self._comm)


def call_ring(fn: Callable, case: RingCase, args: Sequence[Tensor], names: Sequence[str], *,
              what: str, returns: Sequence[str], rank: int) -> tuple[tuple, list[tuple]]:
    """Call the learner's ring `what` (forward or backward) on this rank's `args`, named
    `names`, and the case's position table, watched by a `Recorder` with parlab's ring
    refused; every input must come back unchanged and the result be the tuple `returns`.
    The result, and the events the recorder heard."""
    given = dict(zip(names, args, strict=True), pos=case.table.clone())
    kept = {name: cpu(x) for name, x in given.items()}
    with Recorder(args[1], where=case.name, what=what) as rec:
        got = call_learner(f"{what} ({case.name})", functools.partial(fn, causal=case.causal),
                           *args, given["pos"], refuse=REFUSED, refusal=RING_REFUSED,
                           shape_hint=SHAPES)
    check_unchanged(kept, given, where=f"{what}, {case.name}", rank=rank)
    if not (isinstance(got, tuple) and len(got) == len(returns)):
        fail(f"{case.name}: {what} returned {type(got).__name__}, expected a tuple "
             f"({', '.join(returns)})", rank=rank, hint=f"return {', '.join(returns)}")
    return got, rec.events


def overlap(events: list[tuple]) -> tuple[int, int]:
    """(compute phases with no receive in flight, compute phases)."""
    posted = waited = idle = computed = 0
    for event in events:
        if event[0] == "post" and event[1] == "irecv":
            posted += 1
        elif event[0] == "wait" and event[1] == "irecv":
            waited += 1
        elif event[0] == "compute":
            computed += 1
            idle += posted <= waited
    return idle, computed


def check_protocol(events: list[tuple], rank: int, world: int, what: str, where: str) -> None:
    """Something was sent (on more than one rank), and only to the neighbours."""
    posts = [e for e in events if e[0] == "post"]
    if world > 1 and not any(e[1] in ("send", "isend") for e in posts):
        fail(f"{where}: {what} sent nothing", rank=rank, hint="send the K/V blocks with "
             "dist.isend(...) (called as dist.isend: the tracer does not see a bare isend)")
