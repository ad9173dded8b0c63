"""Mistake: every backward of phase 6 split (W queued), none full.

Replaces the exercise-4 answer's `dualpipe_v_order`. The order is still valid, every W runs
once after its B, but the first r + 1 backwards of phase 6 are full in DualPipe-V (their W at
once) and the W's now run later than DualPipe-V runs them. The check names phase 6.
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "phase 6 is r + 1 times B1 then B0",
}


def dualpipe_v_order(rank, p, m):
    r, order, waiting = rank, [], []
    next_f, next_b = [0, 0], [0, 0]

    def forward(c):
        order.append(Action("F", next_f[c], c))
        next_f[c] += 1

    def backward(c, split):
        i = next_b[c]
        next_b[c] += 1
        order.append(Action("B", i, c))
        (waiting if split else order).append(Action("W", i, c))

    def weight():
        order.append(waiting.pop(0))

    for _ in range(2 * (p - r - 1)):
        forward(0)
    for _ in range(r + 1):
        forward(0)
        forward(1)
    for _ in range(p - r - 1):
        backward(1, split=True)
        weight()
        forward(1)
    for _ in range(m - 2 * p + r + 1):
        forward(0)
        backward(1, split=False)
        forward(1)
        backward(0, split=False)
    for _ in range(p - r - 1):
        backward(1, split=False)
        forward(1)
        backward(0, split=False)
    for j in range(2 * (r + 1)):
        backward(1 - j % 2, split=True)  # wrong: the first r + 1 are full
    for _ in range(p - r - 1):
        weight()
        backward(0, split=True)
    for _ in range(r + 1):
        weight()
    for _ in range(len(waiting)):  # the W's left over, so that every W runs
        weight()
    return order
