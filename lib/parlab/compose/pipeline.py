r"""Run any module 04 schedule on this rank's stages of the parallel Llama.

    schedule = parlab.pp.make_schedule("interleaved_1f1b", pp, m, v)
    loss = run_schedule(schedule, model, grid, inputs=ids, targets=ys, pos=pos, shape=shape)

`schedule[r]` is the list of actions of pipeline rank r; the phases (Warmup: forwards only;
Steady: one forward, one backward; Cooldown: the remaining backwards) are in the schedule
itself (`parlab.pp.schedules`), this loop runs whatever it is given, action by action:

    F(i, s): x = microbatch i's token ids (s = 0) or recv from stage s-1;  y = stage(x)
             last stage: loss_i = vocab_parallel_cross_entropy(y, targets_i) / m (y: this
             TP rank's columns of the logits);  else isend y to s+1
    B(i, s): g = recv dL/dy from stage s+1 (the last stage starts from loss_i);
             backward; isend dL/dx to stage s-1 (s > 0)
    W(i, s): (zb_h1) B computed dL/dx only (autograd.grad, graph kept); W the weights'

Dividing each microbatch loss by m makes the accumulated gradients those of the replica's
whole batch under a mean loss.

Data parallelism overlaps with the last backwards: `sync` (default: the model's
`parlab.compose.grads.data_parallel`, BucketedDDP over the dp groups; pass your own objects
with a `no_sync()` context, or `()` for none) has every backward inside `no_sync()` except
the last B of each chunk, whose gradient hooks then start the all-reduce buckets while the
pipeline drains; the caller's `finish()` waits for them. When a parameter belongs to two
chunks of this rank (a tied head on one rank with v > 1) or the backward is split (zb_h1: the
weight gradients come from `autograd.grad`, which fires no hook), every backward runs inside
`no_sync()` and `finish()` sends all the buckets at the end.

Profiler ranges (`parlab.timeline`): each action is "F mb3 chunk1", "B ...", "W ..."; each
message "send F mb3 to stage 2" / "recv B mb1 from stage 3" (the wait for it included).

Every rank of a TP (or CP, EP) group runs the same actions in
the same order, so the collectives inside a stage (TP all-gathers, the CP ring, the EP
all-to-alls) meet; a split backward runs the stage's backward twice (B then W), collectives
included, on all of them alike.

Messages go to the rank with the same dp, ep, cp, tp coordinates one stage on
(`grid.pp_ranks`): isend, never waited for until the end, so no rank blocks on a busy peer;
irecv posted in the order the *sender* sends on that pair (known from the schedule), so
tensors match without tags. Under NCCL they go over a gloo copy of the world instead
(`grid.p2p`), through the CPU: NCCL runs a pair's sends and receives on one stream in the
order posted, so in 1F1B two neighbours that both send before they receive would wait for
each other (Megatron pairs each send with its receive in one batch_isend_irecv); gloo lets
an isend complete on its own. Why not `parlab.pp.execute`: it addresses
peers by pipeline index as global rank (a grid puts them `tp·cp·ep` apart), runs a toy
Sequential on (b, width) tensors, and needs the barrier of its timing clock; the message
order and the F/B/W steps here are its own, in a stage runner for any grid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from torch.profiler import record_function

from parlab.compose.grads import data_parallel
from parlab.compose.grid import Grid, Positions
from parlab.compose.stage import ParallelLlama
from parlab.pp.schedules import Action, Schedule, rank_and_chunk, shape_of
from parlab.tp.vocab import vocab_parallel_cross_entropy

__all__ = ["Messages", "run_schedule", "synced_backwards"]


class Syncable(Protocol):
    """A data-parallel sync: backwards inside `no_sync()` only accumulate."""

    def no_sync(self) -> contextlib.AbstractContextManager[Any]: ...

Key = tuple[str, int, int]  # ("F" activation for | "B" gradient for, microbatch, stage)


class Messages:
    """The point-to-point messages of one rank for one schedule, peers by global rank."""

    def __init__(self, schedule: Schedule, *, me: int, ranks: list[int], shape: tuple[int, ...],
                 dtype: torch.dtype, device: torch.device,
                 group: dist.ProcessGroup | None = None) -> None:
        self.p, _, self.v, _ = shape_of(schedule)
        self.me, self.ranks, self.shape, self.dtype, self.device = me, ranks, shape, dtype, device
        self.group = group  # None: the default group; else a gloo world (CPU tensors)
        self.wire = device if group is None else torch.device("cpu")
        self.order: dict[int, list[Key]] = {}  # sender -> what it sends me, in its order
        for q, actions in enumerate(schedule):
            for a in actions:
                key = self.produces(a, q)
                if key is not None and q != me and self.owner(key) == me:
                    self.order.setdefault(q, []).append(key)
        self.next = dict.fromkeys(self.order, 0)  # per sender: first message not posted
        self.posted: dict[Key, tuple[Any, Tensor]] = {}
        self.local: dict[Key, Tensor] = {}  # stages of one rank hand over directly
        self.sends: list[tuple[Any, Tensor]] = []

    def produces(self, a: Action, rank: int) -> Key | None:
        """The message an action sends, named by its consumer, or None."""
        s, last = a.chunk * self.p + rank, self.p * self.v - 1
        if a.kind == "F" and s < last:
            return ("F", a.microbatch, s + 1)
        if a.kind == "B" and s > 0:
            return ("B", a.microbatch, s - 1)
        return None

    def owner(self, key: Key) -> int:
        return rank_and_chunk(key[2], self.p)[0]

    def recv(self, key: Key) -> Tensor:
        if key in self.local:
            return self.local.pop(key)
        stage = key[2] - 1 if key[0] == "F" else key[2] + 1
        src = rank_and_chunk(stage, self.p)[0]
        while key not in self.posted:  # every earlier message from src first
            message = self.order[src][self.next[src]]
            buf = torch.empty(self.shape, dtype=self.dtype, device=self.wire)
            self.posted[message] = (dist.irecv(buf, src=self.ranks[src], group=self.group), buf)
            self.next[src] += 1
        work, buf = self.posted.pop(key)
        with record_function(f"recv {key[0]} mb{key[1]} from stage {stage}"):
            work.wait()
        return buf.to(self.device)

    def send(self, key: Key, tensor: Tensor) -> None:
        dst = self.owner(key)
        if dst == self.me:
            self.local[key] = tensor.detach().clone()
            return
        payload = tensor.detach().to(self.wire).contiguous()
        with record_function(f"send {key[0]} mb{key[1]} to stage {key[2]}"):
            work = dist.isend(payload, dst=self.ranks[dst], group=self.group)
        self.sends.append((work, payload))

    def finish(self) -> None:
        for work, _payload in self.sends:
            work.wait()
        self.sends.clear()


@dataclass
class _State:
    """What one rank's run of a schedule carries from action to action."""

    model: ParallelLlama
    box: Messages
    pos: Positions
    inputs: list[Tensor]  # the m microbatches' token ids (b, n) (used by stage 0)
    targets: list[Tensor]  # their next words (b, n) (used by the last stage)
    saved: dict[tuple[int, int], tuple] = field(default_factory=dict)
    losses: list[Tensor] = field(default_factory=list)
    sync: Sequence[Syncable] = ()
    synced: frozenset[int] = frozenset()  # indices of the actions run outside no_sync

    def stage(self, chunk: int) -> int:
        return chunk * self.box.p + self.box.me


def _forward(a: Action, st: _State) -> None:
    i, c, s = a.microbatch, a.chunk, st.stage(a.chunk)
    x = st.inputs[i] if s == 0 else st.box.recv(("F", i, s)).requires_grad_()
    y = st.model.chunks[c](x, st.pos)  # (b, n/t, C), or logits (b, n, V'/t) on the last stage
    if s == st.model.n_stages - 1:  # the mean over the b·n tokens, logits never gathered
        y = vocab_parallel_cross_entropy(y, st.targets[i], st.model.grid.tp,
                                         vocab_size=st.model.vocab) / len(st.inputs)
        st.losses.append(y.detach())
    else:
        st.box.send(("F", i, s + 1), y)
    st.saved[(i, c)] = (x, y, None)


def _backward(a: Action, st: _State, *, split: bool) -> None:
    i, c, s = a.microbatch, a.chunk, st.stage(a.chunk)
    x, y, _ = st.saved.pop((i, c))
    grad = None if s == st.model.n_stages - 1 else st.box.recv(("B", i, s))
    if not split:  # dL/dx and dL/dweights at once
        torch.autograd.backward(y, grad_tensors=grad)  # (gradient hooks may start buckets)
        dx = x.grad if s > 0 else None
    else:  # dL/dx only; keep the graph for W
        st.saved[(i, c)] = (x, y, grad)
        dx = (torch.autograd.grad(y, x, grad_outputs=grad, retain_graph=True)[0]
              if s > 0 else None)
    if dx is not None:
        st.box.send(("B", i, s - 1), dx)


def _weights(a: Action, st: _State) -> None:
    x, y, grad = st.saved.pop((a.microbatch, a.chunk))
    params = list(st.model.chunks[a.chunk].parameters())
    grads = torch.autograd.grad(y, params, grad_outputs=grad, allow_unused=True)
    for p, g in zip(params, grads, strict=True):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g


def synced_backwards(actions: list[Action], model: ParallelLlama, *,
                     split: bool) -> frozenset[int]:
    """Indices of the actions whose backward runs outside no_sync: the last B of each chunk,
    or none when a parameter belongs to two chunks or the backward is split."""
    owners = [id(p) for chunk in model.chunks for p in set(chunk.parameters())]
    if split or len(owners) != len(set(owners)):
        return frozenset()
    last = {a.chunk: i for i, a in enumerate(actions) if a.kind == "B"}
    return frozenset(last.values())


@contextlib.contextmanager
def _accumulating(sync: Sequence[Syncable]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for s in sync:
            stack.enter_context(s.no_sync())
        yield


def run_schedule(schedule: Schedule, model: ParallelLlama, grid: Grid, *,
                 inputs: list[Tensor], targets: list[Tensor], pos: Positions,
                 shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 sync: Sequence[Syncable] | None = None) -> Tensor:
    """Run this rank's actions of `schedule`; the sum of its microbatch losses (each / m) on
    the last stage's ranks, 0 elsewhere. shape: one activation message, (b, n/t, C).
    sync: the data-parallel syncs whose no_sync() the earlier backwards run in (module
    docstring); None: the model's own BucketedDDPs (`data_parallel`)."""
    me, split = grid.coords["pp"], shape_of(schedule)[3]
    if sync is None:
        sync = data_parallel(model, grid)
        for ddp in sync:
            ddp.discard()  # a previous step whose sync was skipped left buckets in flight
    box = Messages(schedule, me=me, ranks=grid.pp_ranks, shape=shape, dtype=dtype,
                   device=inputs[0].device, group=grid.p2p)
    actions = schedule[me]
    st = _State(model, box, pos, inputs, targets, sync=sync,
                synced=synced_backwards(actions, model, split=split))
    for index, a in enumerate(actions):  # the schedule's Warmup, Steady and Cooldown
        with record_function(f"{a.kind} mb{a.microbatch} chunk{a.chunk}"):
            if a.kind == "F":
                _forward(a, st)
            elif a.kind == "W":
                _weights(a, st)
            elif index in st.synced:
                _backward(a, st, split=split)
            else:
                with _accumulating(st.sync):
                    _backward(a, st, split=split)
    box.finish()
    return torch.stack(st.losses).sum() if st.losses else torch.zeros((), device=box.device)
