"""os._exit in an answer cell: the kernel ends while the cell that defines `double` runs.

The grader records KernelDied on that cell, starts a new kernel and re-runs only the cells that
had succeeded, so `double` is never defined. Expected: double_test scores 0 with NameError,
and its message says that `double` is defined in double_answer, which did not finish; the
other tests keep their points.
"""

ANSWERS = {"double_answer": '''\
import os


def double(x):
    return 2 * x


os._exit(1)  # a leftover from debugging: ends the kernel
'''}
EXPECT = {"double_test": ("NameError", "is defined in cell double_answer, which did not finish")}
MAX_SECONDS = 60
