"""1F1B without the three phases written out: each rank runs one loop that starts the next
forward while fewer than min(p - r, m) micro-batches are in flight (and forwards remain), and
otherwise finishes the oldest one's backward."""

PASSES = ["check_1f1b"]


def one_f_one_b(p, m):
    schedule = []
    for r in range(p):
        limit, order, next_f, next_b = min(p - r, m), [], 0, 0
        while next_b < m:
            if next_f < m and next_f - next_b < limit:
                order.append(Action("F", next_f))  # noqa: F821
                next_f += 1
            else:
                order.append(Action("B", next_b))  # noqa: F821
                next_b += 1
        schedule.append(order)
    return schedule
