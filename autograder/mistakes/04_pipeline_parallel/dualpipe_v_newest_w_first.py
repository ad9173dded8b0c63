"""Mistake: each W takes the newest waiting weight gradient instead of the oldest.

Replaces the exercise-4 answer's `dualpipe_v_order` (waiting.pop() for waiting.pop(0)). The
order is valid, every W after its B, but DualPipe-V's queue is first in, first out: the
oldest split backward's inputs are freed first. The check names the phase where the first W
differs.
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "the W at the front of the queue",
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
        order.append(waiting.pop())  # wrong: pop(0), the oldest

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
        backward(1 - j % 2, split=j >= r + 1)
    for _ in range(p - r - 1):
        weight()
        backward(0, split=True)
    for _ in range(r + 1):
        weight()
    return order
