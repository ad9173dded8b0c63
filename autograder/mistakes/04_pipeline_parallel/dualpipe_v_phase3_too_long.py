"""Mistake: phase 3 loops p - r times instead of p - r - 1: one B1 split, W and F1 too many
where phase 4 should begin.

Replaces the exercise-4 answer's `dualpipe_v_order`. The first difference sits where phase 3
ends and phase 4 begins (on p = 1 phase 3 has no actions at all), and the comparison cannot
tell a phase that ran long from one that starts wrong: the check names every phase there,
phase 3 included, not phase 4 alone.
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "phase 3 is p - r - 1 times",
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
    for _ in range(p - r):  # wrong: p - r - 1
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
