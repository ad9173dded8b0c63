"""Mistake: dualpipe_v_order written for the visible run's sizes, p = 2 and m = 5.

Replaces the exercise-4 answer's `dualpipe_v_order`: the phase counts use p = 2 and m = 5
whatever the arguments say. The visible rank run (2 ranks, m = 2p + 1 = 5) would pass; the
check also builds the order for eight other (p, m), p = 1 to 5 and m from 2p to 3p + 2, and
fails at the first one.
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "dualpipe_v_order(r, p=1, m=2)",
}


def dualpipe_v_order(rank, p, m):
    p, m = 2, 5  # wrong: the sizes of the visible run
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
        backward(1 - j % 2, split=j >= r + 1)
    for _ in range(p - r - 1):
        weight()
        backward(0, split=True)
    for _ in range(r + 1):
        weight()
    return order
