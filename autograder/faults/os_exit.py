"""os._exit in the kernel: the process running the notebook ends in the middle of a test.

nbgrader alone drops the whole submission. Expected: double_test scores 0 with KernelDied
("the kernel died while running this cell"); a new kernel re-runs the cells that had
succeeded, and square_test still gets its point.
"""

ANSWERS = {"double_answer": '''\
import os


def double(x):
    os._exit(1)
'''}
EXPECT = {"double_test": ("KernelDied", "the kernel died while running this cell")}
MAX_SECONDS = 60
