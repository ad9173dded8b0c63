"""Mistake: 1F1B's steady step runs the backward of the oldest microbatch before the forward
of the new one.

On the last rank (no warm-up) the very first action is then B0, before F0 has stored the
activations B0 needs: the schedule cannot run. Replaces one_f_one_b (exercise 1).
"""

CAUGHT_BY = {
    "check_1f1b": "a backward needs the activations its forward stored",
}


def one_f_one_b(p, m):
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        order = [Action("F", i) for i in range(warmup)]  # noqa: F821
        for i in range(m - warmup):
            order += [Action("B", i), Action("F", warmup + i)]  # noqa: F821 - B first
        order += [Action("B", i) for i in range(m - warmup, m)]  # noqa: F821
        schedule.append(order)
    return schedule
