"""Mistake: 1F1B's warm-up runs p - r forwards instead of p - r - 1.

The schedule still runs and its bubble is unchanged, but every rank holds one microbatch
more than it needs (p + 1 on rank 0), which is the one thing 1F1B is for. Replaces
one_f_one_b (exercise 1).
"""

CAUGHT_BY = {
    "check_1f1b": "warm-up count off by one",
}


def one_f_one_b(p, m):
    schedule = []
    for r in range(p):
        warmup = min(p - r, m)  # one too many
        order = [Action("F", i) for i in range(warmup)]  # noqa: F821
        for i in range(m - warmup):
            order += [Action("F", warmup + i), Action("B", i)]  # noqa: F821
        order += [Action("B", i) for i in range(m - warmup, m)]  # noqa: F821
        schedule.append(order)
    return schedule
