r"""Run any module 04 schedule on this rank's stages of the parallel Llama.

    schedule = parlab.pp.make_schedule("interleaved_1f1b", pp, m, v)
    loss = run_schedule(schedule, model, grid, inputs=ids, targets=ys, pos=pos, shape=shape)

`schedule[r]` is the list of actions of pipeline rank r; the phases (Warmup: forwards only;
Steady: one forward, one backward; Cooldown: the remaining backwards) are in the schedule
itself (`parlab.pp.schedules`), this loop runs whatever it is given, action by action:

    F(i, s): x = microbatch i's token ids (s = 0) or recv from stage s-1;  y = stage(x)
             last stage: loss_i = cross_entropy(y, targets_i) / m;  else isend y to s+1
    B(i, s): g = recv dL/dy from stage s+1 (the last stage starts from loss_i);
             backward; isend dL/dx to stage s-1 (s > 0)
    W(i, s): (zb_h1) B computed dL/dx only (autograd.grad, graph kept); W the weights'

Dividing each microbatch loss by m makes the accumulated gradients those of the replica's
whole batch under a mean loss. Every rank of a TP (or CP, EP) group runs the same actions in
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

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from parlab.compose.grid import Grid, Positions
from parlab.compose.stage import ParallelLlama
from parlab.pp.schedules import Action, Schedule, rank_and_chunk, shape_of

__all__ = ["Messages", "run_schedule"]

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
        work.wait()
        return buf.to(self.device)

    def send(self, key: Key, tensor: Tensor) -> None:
        dst = self.owner(key)
        if dst == self.me:
            self.local[key] = tensor.detach().clone()
            return
        payload = tensor.detach().to(self.wire).contiguous()
        self.sends.append((dist.isend(payload, dst=self.ranks[dst], group=self.group), payload))

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

    def stage(self, chunk: int) -> int:
        return chunk * self.box.p + self.box.me


def _forward(a: Action, st: _State) -> None:
    i, c, s = a.microbatch, a.chunk, st.stage(a.chunk)
    x = st.inputs[i] if s == 0 else st.box.recv(("F", i, s)).requires_grad_()
    y = st.model.chunks[c](x, st.pos)  # (b, n/t, C), or logits (b, n, V) on the last stage
    if s == st.model.n_stages - 1:
        y = F.cross_entropy(y.flatten(0, 1), st.targets[i].flatten()) / len(st.inputs)
        st.losses.append(y.detach())
    else:
        st.box.send(("F", i, s + 1), y)
    st.saved[(i, c)] = (x, y, None)


def _backward(a: Action, st: _State, *, split: bool) -> None:
    i, c, s = a.microbatch, a.chunk, st.stage(a.chunk)
    x, y, _ = st.saved.pop((i, c))
    grad = None if s == st.model.n_stages - 1 else st.box.recv(("B", i, s))
    if not split:  # dL/dx and dL/dweights at once
        torch.autograd.backward(y, grad_tensors=grad)
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


def run_schedule(schedule: Schedule, model: ParallelLlama, grid: Grid, *,
                 inputs: list[Tensor], targets: list[Tensor], pos: Positions,
                 shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
    """Run this rank's actions of `schedule`; the sum of its microbatch losses (each / m) on
    the last stage's ranks, 0 elsewhere. shape: one activation message, (b, n/t, C)."""
    me, split = grid.coords["pp"], shape_of(schedule)[3]
    box = Messages(schedule, me=me, ranks=grid.pp_ranks, shape=shape, dtype=dtype,
                   device=inputs[0].device, group=grid.p2p)
    st = _State(model, box, pos, inputs, targets)
    for a in schedule[me]:  # the schedule's Warmup, Steady and Cooldown, in its order
        if a.kind == "F":
            _forward(a, st)
        elif a.kind == "B":
            _backward(a, st, split=split)
        else:
            _weights(a, st)
    box.finish()
    return torch.stack(st.losses).sum() if st.losses else torch.zeros((), device=box.device)
