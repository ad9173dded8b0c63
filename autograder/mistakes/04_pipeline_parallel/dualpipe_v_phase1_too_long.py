"""Mistake: phase 1 loops 2(p - r) times instead of 2(p - r - 1): two forwards of chunk 0
too many before the first F1.

Replaces the exercise-4 answer's `dualpipe_v_order`. The extra forwards sit where DualPipe-V
starts phase 2; the check must say what it counted (the forwards of chunk 0 before the first
F1, phase 1's share of them), not blame phase 2, and name only the case it ran (one m).
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "forwards of chunk 0 before its first F1",
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

    for _ in range(2 * (p - r)):  # wrong: 2(p - r - 1)
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
        backward(0, split=False)
        forward(1)
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
