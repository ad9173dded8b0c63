r"""Run any valid pipeline schedule on real ranks, over point-to-point messages.

The model (`parlab.pp.model`) is a stack of `n_layers` small layers (Linear + tanh, `width`
wide), split into $p \cdot v$ stages of equal size; rank r holds stages r, r + p, ... (its
chunks, looped placement), or r and 2p - 1 - r (placement "v", DualPipe-V: stages p - 1
and p both on rank p - 1 hand over without a message).
The batch (B, width) is split into m microbatches of B/m rows.
Per action:

    F(i, s): x = microbatch i (s = 0) or recv from stage s-1;  y = stage(x)
             last stage: loss_i = mse(y, target_i) / m;  else isend y to stage s+1
    B(i, s): g = recv dL/dy from stage s+1 (the last stage starts from loss_i);
             backward through the stage; isend dL/dx to stage s-1 (s > 0)
    W(i, s): (split backward only) B computed dL/dx alone; W computes dL/dweights

Scaling every microbatch's loss by 1/m makes the summed losses and the accumulated gradients
equal those of the full batch under a mean loss: $L = \frac{1}{m}\sum_i L_i$. A split
backward (B then W) walks the stage's graph twice (retain_graph), which is simple, not fast.

Messages: sends are `dist.isend` and never waited on until the end, so a rank never blocks
on a peer that is itself busy sending (blocking sends deadlock 1F1B). Receives are posted
with `dist.irecv`, all before the first action, in the order the *sender* sends on each pair
of ranks (every rank knows it from the schedule): tensors match without tags, and a message
is taken in the moment it is sent. Posting ahead suits gloo; on NCCL see `parlab.pp.run`.

Timing: each action waits for its input (idle), then runs; with `costs=(t_f, t_b, t_w)` in
seconds (for a rank's whole share, as `parlab.pp.simulator`) it also sleeps until it has lasted
its cost, which makes the real timeline comparable with `simulate`. Clock: perf_counter,
shared by the processes of one machine.

Under a profiler (`parlab.launch.run(..., trace=path)`) every action is a range named by
`range_name`, "F mb3 chunk1" (kind, microbatch, chunk), around its compute and its sleep; the
wait for its input is "recv F mb3 chunk1" and the hand-over of its output "send F mb3 chunk1
to rank 2", so a rank's idle time is what lies between its F/B/W ranges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

from parlab.pp.actions import Action, Schedule, placed_rank, placed_stage
from parlab.pp.model import build_chunks, make_data, make_model
from parlab.pp.schedules import shape_of
from parlab.pp.simulator import Span, action_cost

__all__ = ["StageContext", "make_context", "Mailbox", "execute", "range_name"]


def range_name(a: Action) -> str:
    """The profiler range of one action: "F mb3 chunk1" (kind, microbatch, chunk)."""
    return f"{a.kind} mb{a.microbatch} chunk{a.chunk}"


@dataclass
class StageContext:
    """What one rank knows while it runs its actions. The v = 1 fields (`stage`, `is_first`,
    `is_last`, `prev_rank`, `next_rank`) are what exercise 2's step functions use."""

    rank: int
    p: int
    m: int
    v: int
    chunks: list[nn.Sequential]
    inputs: list[Tensor] | None  # the m microbatches of x, on the rank holding stage 0
    targets: list[Tensor] | None  # the m microbatches of the target, on the last stage's rank
    shape: tuple[int, ...]  # one microbatch's activation, (B/m, width)
    dtype: torch.dtype
    loss_fn: Callable[[Tensor, Tensor], Tensor] = F.mse_loss
    saved: dict = field(default_factory=dict)  # (microbatch[, chunk]) -> what B and W need
    losses: list = field(default_factory=list)  # each microbatch's loss / m (last stage)
    sends: list = field(default_factory=list)  # pending isend handles, waited at the end
    placement: str = "looped"  # or "v" (DualPipe-V): where this rank's chunks sit

    def stage_index(self, chunk: int = 0) -> int:
        return placed_stage(self.rank, chunk, self.p, self.placement)

    def owner(self, stage: int) -> int:
        """The rank holding `stage`."""
        return placed_rank(stage, self.p, self.placement)[0]

    def first(self, chunk: int = 0) -> bool:
        return self.stage_index(chunk) == 0

    def last(self, chunk: int = 0) -> bool:
        return self.stage_index(chunk) == self.p * self.v - 1

    @property
    def stage(self) -> nn.Module:
        return self.chunks[0]

    @property
    def is_first(self) -> bool:
        return self.first(0)

    @property
    def is_last(self) -> bool:
        return self.last(self.v - 1)

    @property
    def prev_rank(self) -> int | None:
        return None if self.is_first else (self.rank - 1) % self.p

    @property
    def next_rank(self) -> int | None:
        return None if self.is_last else (self.rank + 1) % self.p


def make_context(p: int, m: int, v: int, *, n_layers: int = 8, width: int = 16,
                 batch: int = 16, seed: int = 0, dtype: torch.dtype = torch.float64,
                 layers_of: Callable | None = None,
                 placement: str = "looped") -> tuple[StageContext, list[list[int]]]:
    """In a rank: build this rank's chunks and data from the seeded model."""
    rank = dist.get_rank()
    if batch % m:
        raise ValueError(f"batch {batch} does not split into {m} microbatches")
    model = make_model(n_layers, width, seed=seed, dtype=dtype)
    x, y = make_data(batch, width, seed=seed, dtype=dtype)
    chunks, index = build_chunks(model, rank, p, v, layers_of, placement=placement)
    ctx = StageContext(rank, p, m, v, chunks, None, None, (batch // m, width), dtype,
                       placement=placement)
    if rank == ctx.owner(0):
        ctx.inputs = list(x.chunk(m))
    if rank == ctx.owner(p * v - 1):
        ctx.targets = list(y.chunk(m))
    return ctx, index


class Mailbox:
    """Point-to-point messages of one rank for one schedule.

    A message is named by what consumes it: ("F", i, s) is the activation stage s needs for
    F(i); ("B", i, s) the gradient it needs for B(i). Receives are posted in the sender's
    order on each pair of ranks, so tensors match without tags."""

    def __init__(self, schedule: Schedule, ctx: StageContext) -> None:
        self.ctx = ctx
        self.order: dict[int, list[tuple]] = {}  # sender -> messages to me, in its order
        for q, actions in enumerate(schedule):
            for a in actions:
                out = self.produces(a, q)
                if out is not None and ctx.owner(out[2]) == ctx.rank and q != ctx.rank:
                    self.order.setdefault(q, []).append(out)
        self.next_post = dict.fromkeys(self.order, 0)  # per sender: first message not posted
        self.posted: dict[tuple, tuple[Any, Tensor]] = {}
        self.local: dict[tuple, Tensor] = {}  # stages that hand over within the rank

    def produces(self, a: Action, rank: int) -> tuple | None:
        """The message an action sends, named by its consumer, or None."""
        s = placed_stage(rank, a.chunk, self.ctx.p, self.ctx.placement)
        last = self.ctx.p * self.ctx.v - 1
        if a.kind == "F" and s < last:
            return ("F", a.microbatch, s + 1)
        if a.kind == "B" and s > 0:
            return ("B", a.microbatch, s - 1)
        return None

    def recv(self, key: tuple) -> Tensor:
        if key in self.local:
            return self.local.pop(key)
        src = self.ctx.owner(key[2] - 1 if key[0] == "F" else key[2] + 1)
        while key not in self.posted:  # post every earlier message from src first
            self._post(src)
        work, buf = self.posted.pop(key)
        work.wait()
        return buf

    def _post(self, src: int) -> None:
        message = self.order[src][self.next_post[src]]
        buf = torch.empty(self.ctx.shape, dtype=self.ctx.dtype)
        self.posted[message] = (dist.irecv(buf, src=src), buf)
        self.next_post[src] += 1

    def post_all(self) -> None:
        """Post every receive now: a message is then taken in as soon as it is sent, and
        waiting for it costs no extra hand-shake (m v small buffers; fine for a toy model)."""
        for src, messages in self.order.items():
            while self.next_post[src] < len(messages):
                self._post(src)

    def destination(self, key: tuple) -> int:
        """The rank that consumes message `key`."""
        return self.ctx.owner(key[2])

    def send(self, key: tuple, tensor: Tensor) -> None:
        dst = self.destination(key)
        if dst == self.ctx.rank:
            self.local[key] = tensor.detach().clone()
            return
        payload = tensor.detach().contiguous()
        self.ctx.sends.append((dist.isend(payload, dst=dst), payload))


def _held(data: list[Tensor] | None, what: str, rank: int) -> list[Tensor]:
    if data is None:
        raise RuntimeError(f"rank {rank} holds no {what}: the schedule put a stage elsewhere")
    return data


def _receive(a: Action, ctx: StageContext, box: Mailbox) -> Tensor | None:
    s = ctx.stage_index(a.chunk)
    if a.kind == "F" and s == 0:
        return _held(ctx.inputs, "inputs", ctx.rank)[a.microbatch]
    if a.kind == "W" or a.kind == "B" and ctx.last(a.chunk):
        return None
    with record_function(f"recv {range_name(a)}"):  # waiting here is idle time
        return box.recv((a.kind, a.microbatch, s))


def _compute(a: Action, ctx: StageContext, got: Tensor | None, split: bool) -> Tensor | None:
    """Run one action's maths; return what it sends (or None)."""
    i, c, key = a.microbatch, a.chunk, (a.microbatch, a.chunk)
    if a.kind == "F":
        assert got is not None  # _receive gives every F its input
        x = got if ctx.first(c) else got.requires_grad_()  # (b, width)
        y = ctx.chunks[c](x)  # (b, width)
        if ctx.last(c):
            target = _held(ctx.targets, "targets", ctx.rank)[i]
            y = ctx.loss_fn(y, target) / ctx.m  # this microbatch's share of the loss
            ctx.losses.append(y.detach())
        ctx.saved[key] = (x, y, None)
        return None if ctx.last(c) else y
    x, y, grad = ctx.saved[key]
    if a.kind == "B" and not split:  # B and W at once
        del ctx.saved[key]
        torch.autograd.backward(y, grad_tensors=got)
        return None if ctx.first(c) else x.grad
    if a.kind == "B":  # dL/dx only; keep the graph for W
        ctx.saved[key] = (x, y, got)
        if ctx.first(c):
            return None
        (gx,) = torch.autograd.grad(y, x, grad_outputs=got, retain_graph=True)
        return gx
    params = list(ctx.chunks[c].parameters())  # W: dL/dweights, accumulated
    del ctx.saved[key]
    for p, g in zip(params, torch.autograd.grad(y, params, grad_outputs=grad), strict=True):
        p.grad = g if p.grad is None else p.grad + g
    return None


def _warm_up() -> None:
    """A process's first backward with an explicit output gradient imports sympy (torch's
    _make_grads, ~0.3-0.7 s): do it before the clock starts."""
    x = torch.ones(2, requires_grad=True)
    torch.autograd.backward(x * x, grad_tensors=torch.ones(2))
    torch.autograd.grad(x * x, x, grad_outputs=torch.ones(2))


def execute(schedule: Schedule, ctx: StageContext, *,
            costs: tuple[float, float, float] | None = None) -> tuple[list[Span], float]:
    """Run this rank's actions; return its timeline and its peak activations (chunk = 1/v).

    costs: (t_f, t_b, t_w) in seconds for the rank's whole share; each action then lasts at
    least its cost (computing, then sleeping out the rest) before it posts its send.

    It starts with a barrier so that the ranks' clocks start together. Under
    TORCH_DISTRIBUTED_DEBUG=DETAIL (parlab.launch's default) the launcher sends point-to-point
    calls through a group of their own (`parlab.comm.route_p2p`): the end stages make fewer of
    them, which would otherwise put the ranks' collective sequence numbers out of step, so
    collectives and further schedules may follow (`parlab.pp.measure` runs twelve in a row)."""
    _, _, v, split = shape_of(schedule)
    box = Mailbox(schedule, ctx)
    spans, peak = [], 0
    _warm_up()
    dist.barrier()
    box.post_all()  # after the barrier: see the docstring
    for a in schedule[ctx.rank]:
        got = _receive(a, ctx, box)  # waiting here is idle time, not the action's
        with record_function(range_name(a)):
            start = time.perf_counter()
            out = _compute(a, ctx, got, split)
            peak = max(peak, len(ctx.saved))
            if costs is not None:  # the output exists once the cost has passed, not before
                cost = action_cost(a, v=v, split=split, t_f=costs[0], t_b=costs[1],
                                   t_w=costs[2])
                time.sleep(max(0.0, start + cost - time.perf_counter()))
            spans.append(Span(ctx.rank, a, start, time.perf_counter()))  # its output exists
        message = box.produces(a, ctx.rank)
        if out is not None and message is not None:
            with record_function(f"send {range_name(a)} to rank {box.destination(message)}"):
                box.send(message, out)
    for work, _payload in ctx.sends:
        work.wait()
    ctx.sends.clear()
    return spans, peak / v
