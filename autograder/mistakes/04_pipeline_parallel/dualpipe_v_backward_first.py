"""Mistake: phase 4's pairs written backward first: B1 then F0, B0 then F1.

Replaces the exercise-4 answer's `dualpipe_v_order`. In a pair the forward comes first (on a
GPU both run at once; in the list, F then its partner's full backward). With B first, rank
p - 1's first B1 needs the gradient of stage p, which comes from its own F0, not yet run: a
deadlock, and on the other ranks an order that is not DualPipe-V's. The check names phase 4.
"""

from parlab.pp import Action

CAUGHT_BY = {
    "check_dualpipe_v": "phase 4 is m - 2p + r + 1 times the pairs F0&B1 then F1&B0",
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
        backward(1, split=False)  # wrong: the pair's forward first
        forward(0)
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
