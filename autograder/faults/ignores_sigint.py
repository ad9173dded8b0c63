"""A loop that ignores SIGINT, so the interrupt sent on a cell timeout does nothing.

nbgrader alone drops the whole submission. Expected: double_test scores 0 with
KernelUnresponsive ("ignored the interrupt"); the grader kills the kernel and its processes,
starts a new one, re-runs the cells that had succeeded, and square_test still gets its point.
"""

ANSWERS = {"double_answer": '''\
import signal


def double(x):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        pass
'''}
EXPECT = {"double_test": ("KernelUnresponsive", "ignored the interrupt")}
MAX_SECONDS = 90
