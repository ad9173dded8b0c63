"""Output without end: a test that prints 5 MB, line by line (five times the limit per cell).

Expected: the grader keeps at most ResilientExecute.cell_output_limit bytes of the cell's
output (parlab.grading.autograde.outputs), drops the rest as it arrives (neither the notebook, the
grader's memory nor the feedback grows without bound), and double_test scores 0 with
OutputLimit naming the limit; square_test is graded.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    line = "spam " * 20
    for _ in range(50_000):
        print(line)
    return 2 * x
'''}
EXPECT = {"double_test": ("OutputLimit", "bytes")}
MAX_SECONDS = 60
