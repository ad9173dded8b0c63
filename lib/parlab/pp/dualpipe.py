r"""DualPipe-V: two chunks per rank in a V, the backward split, forwards and backwards paired.

DualPipe (DeepSeek-AI, DeepSeek-V3 technical report, arXiv:2412.19437) feeds micro-batches
from both ends of the pipeline; DualPipe-V, in the DualPipe repository (github.com/deepseek-ai/
DualPipe, `DualPipeV`, after Sea AI Lab's "cut-in-half"), keeps one direction and folds the
pipeline in two: $2p$ stages on $p$ ranks, rank r holding stage r (chunk 0) and stage
$2p-1-r$ (chunk 1): the V placement of `parlab.pp.actions`. Micro-batches enter at rank 0,
go down to rank p-1, turn there and come back; rank 0 computes the loss. It needs
$m \ge 2p$ micro-batches.

Rank r runs eight phases (counts as in `DualPipeV.step`; F0 is a forward of chunk 0, B1 a
backward of chunk 1, micro-batches in order on each chunk; "F&B" a forward and a backward
of the other chunk run as one overlapped unit):

    1  2(p-r-1) x  F0
    2  (r+1)    x  F0 F1
    3  (p-r-1)  x  B1 W1 F1                       (B1 split, its W at once)
    4  (m-2p+r+1) x F0&B1  F1&B0                  (full backwards; on rank p-1 the very
                                                   first F0, B1 are not paired)
    5  (p-r-1)  x  B1  F1&B0
    6  (r+1)    x  B1 B0                          (the first r+1 of these 2(r+1) backwards
                                                   full, the last r+1 split)
    7  (p-r-1)  x  W  B0 (split)
    8  (r+1)    x  W

A split backward ("zero bubble", Qi et al., arXiv:2401.10241) runs B (dL/dinput) now and
leaves its W (dL/dweights) in a queue; every W above takes the oldest one waiting. A full
backward is written here as B followed at once by its W, so every schedule of this module has
W actions.

Conventions of the closed forms (DualPipe's README table, per chunk: F a forward, B a FULL
backward, W its weight half, F&B an overlapped pair): the published bubble is
$(\frac{PP}{2}-1)(F\&B + B - 3W)$ with PP = 2p stages, i.e. $(p-1)(F\&B + B - 3W)$. It is the
idle time of the last rank (p-1, the tip of the V, which runs the most pairs:
$2m-2p-1$). In the simulator (`simulate(..., t_fb=)`, costs for a rank's whole share, so a
chunk's F is t_f/2 and a pair t_fb/2) it holds exactly when the forward, the input-gradient
backward and the weight backward of a chunk cost the same (t_f = t_b = t_w, as in the
README's figure: F = 1, B = 2, W = 1), for any pair cost from max(F, B) to F + B; zero
point-to-point latency. Otherwise the published form is not exact (`formula_gap` in the
tests and notebook 04 shows by how much). Peak activations: $2p+1$ chunk-micro-batches on
every rank, DualPipe's "PP + 1" (in units of a rank's share, two chunks: $p + \frac12$).
"""

from __future__ import annotations

from parlab.pp.actions import Action, PlacedSchedule

__all__ = ["dualpipe_v", "dualpipe_v_rank", "dualpipe_v_phases", "dualpipe_v_bubble",
           "dualpipe_v_makespan", "dualpipe_v_peak", "PHASES"]

PHASES = ("1: F0", "2: F0 F1", "3: B1 W1 F1", "4: F0&B1 F1&B0", "5: B1 F1&B0", "6: B1 B0",
          "7: W B0", "8: W")


class _Rank:
    """One rank's list of actions, built phase by phase (see the module docstring)."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.pairs: list[tuple[int, int]] = []
        self.phase_of: list[int] = []  # the phase (1..8) of each action
        self.phase = 0
        self.next_f, self.next_b = [0, 0], [0, 0]
        self.waiting: list[Action] = []  # W's of split backwards, oldest first

    def _add(self, a: Action) -> None:
        self.actions.append(a)
        self.phase_of.append(self.phase)

    def f(self, c: int) -> None:
        self._add(Action("F", self.next_f[c], c))
        self.next_f[c] += 1

    def b(self, c: int, *, split: bool) -> None:
        i = self.next_b[c]
        self.next_b[c] += 1
        self._add(Action("B", i, c))
        if split:
            self.waiting.append(Action("W", i, c))
        else:
            self._add(Action("W", i, c))

    def w(self) -> None:
        self._add(self.waiting.pop(0))

    def fb(self, f_chunk: int, b_chunk: int) -> None:
        start = len(self.actions)
        self.f(f_chunk)
        self.b(b_chunk, split=False)
        self.pairs.append((start, len(self.actions)))


def _check(p: int, m: int) -> None:
    if m < 2 * p:
        raise ValueError(f"DualPipe-V needs m >= 2p micro-batches (DualPipeV asserts it: "
                         f"every rank's two chunks fill before the first backward returns): "
                         f"m = {m}, p = {p}; try m = {2 * p}")


def _build(r: int, p: int, m: int) -> _Rank:
    """Rank r's eight phases (module docstring), in DualPipeV.step's order."""
    k = _Rank()
    k.phase = 1
    for _ in range(2 * (p - r - 1)):
        k.f(0)
    k.phase = 2
    for _ in range(r + 1):
        k.f(0)
        k.f(1)
    k.phase = 3
    for _ in range(p - r - 1):
        k.b(1, split=True)
        k.w()  # the W of the B1 just run: the queue held nothing else
        k.f(1)
    k.phase = 4
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # DualPipeV leaves this pair unoverlapped (less bubble)
            k.f(0)
            k.b(1, split=False)
        else:
            k.fb(0, 1)
        k.fb(1, 0)
    k.phase = 5
    for _ in range(p - r - 1):
        k.b(1, split=False)
        k.fb(1, 0)
    k.phase = 6
    for j in range(2 * (r + 1)):  # B1 B0 B1 B0 ...: the first r + 1 full, the rest split
        k.b(1 - j % 2, split=j >= r + 1)
    k.phase = 7
    for _ in range(p - r - 1):
        k.w()
        k.b(0, split=True)
    k.phase = 8
    for _ in range(r + 1):
        k.w()
    assert not k.waiting, "every split backward's W runs"
    return k


def dualpipe_v_rank(rank: int, p: int, m: int) -> list[Action]:
    """Rank `rank`'s actions in order (the phases of the module docstring)."""
    _check(p, m)
    return _build(rank, p, m).actions


def dualpipe_v(p: int, m: int) -> PlacedSchedule:
    """DualPipe-V on p ranks (2p stages, V placement) with m >= 2p micro-batches; each rank's
    overlapped F&B units are marked (`PlacedSchedule.overlapped`)."""
    _check(p, m)
    ranks = [_build(r, p, m) for r in range(p)]
    return PlacedSchedule([k.actions for k in ranks], placement="v",
                          overlapped=[k.pairs for k in ranks])


def dualpipe_v_phases(rank: int, p: int, m: int) -> list[int]:
    """The phase (1..8) of each of rank `rank`'s actions, for messages and pictures."""
    _check(p, m)
    return _build(rank, p, m).phase_of


def dualpipe_v_bubble(p: int, f: float, b: float, w: float, fb: float | None = None) -> float:
    r"""DualPipe's published bubble for DualPipe-V on p ranks, $(p-1)(F\&B + B - 3W)$, with
    per-chunk costs: f a forward, b a FULL backward (input and weights), w the weight half,
    fb an overlapped pair (default f + b: no overlap). Exact in `simulate` when the forward,
    input backward and weight backward cost the same (module docstring)."""
    fb = f + b if fb is None else fb
    return (p - 1) * (fb + b - 3 * w)


def dualpipe_v_makespan(p: int, m: int, f: float, b: float, w: float,
                        fb: float | None = None) -> float:
    """The last rank's step: its 2m - 2p - 1 pairs, its 2p + 1 unpaired forwards and full
    backwards, and the published bubble (same conventions as `dualpipe_v_bubble`)."""
    _check(p, m)
    fb = f + b if fb is None else fb
    return (2 * m - 2 * p - 1) * fb + (2 * p + 1) * (f + b) + dualpipe_v_bubble(p, f, b, w, fb)


def dualpipe_v_peak(p: int) -> float:
    """Peak activations per rank in units of its share (two chunks): (2p + 1) / 2."""
    return (2 * p + 1) / 2
