"""An infinite loop in plain Python, in the kernel (not on a rank).

Expected: nbgrader's cell timeout interrupts double_test, which scores 0 with a
CellTimeoutError that says the cell was still running after the limit; the kernel survives
and square_test, after it, is graded as usual.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    while True:
        pass
'''}
EXPECT = {"double_test": ("CellTimeoutError", "was still running after")}
MAX_SECONDS = 60
