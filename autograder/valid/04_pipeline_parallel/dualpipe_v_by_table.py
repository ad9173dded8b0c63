"""DualPipe-V's phases as data: a table of (repeats, steps) rows, one row per phase (phase 6,
whose steps alternate chunks, as two rows), run by one loop over the given helpers; the V
placement by indexing the pair (rank, 2p - 1 - rank)."""

PASSES = ["check_dualpipe_v"]


def v_stage_of(rank, chunk, p):
    return (rank, 2 * p - 1 - rank)[chunk]


def dualpipe_v_order(rank, p, m):
    r, order, waiting = rank, [], []
    next_f, next_b = [0, 0], [0, 0]

    def forward(c):
        order.append(Action("F", next_f[c], c))  # noqa: F821
        next_f[c] += 1

    def backward(c, split):
        i = next_b[c]
        next_b[c] += 1
        order.append(Action("B", i, c))  # noqa: F821
        (waiting if split else order).append(Action("W", i, c))  # noqa: F821

    def weight():
        order.append(waiting.pop(0))

    F0, F1, W = (lambda: forward(0)), (lambda: forward(1)), weight
    B0, B1 = (lambda: backward(0, False)), (lambda: backward(1, False))
    B0s, B1s = (lambda: backward(0, True)), (lambda: backward(1, True))
    phases = [
        (2 * (p - r - 1), [F0]),  # 1: chunk 0 warms up
        (r + 1, [F0, F1]),  # 2
        (p - r - 1, [B1s, W, F1]),  # 3
        (m - 2 * p + r + 1, [F0, B1, F1, B0]),  # 4: the steady pairs
        (p - r - 1, [B1, F1, B0]),  # 5
        (1, [(B1, B0)[j % 2] for j in range(r + 1)]),  # 6: B1 B0 ..., r + 1 whole,
        (1, [(B1s, B0s)[j % 2] for j in range(r + 1, 2 * (r + 1))]),  # then r + 1 split
        (p - r - 1, [W, B0s]),  # 7
        (r + 1, [W]),  # 8
    ]
    for repeats, steps in phases:
        for _ in range(repeats):
            for step in steps:
                step()
    return order
