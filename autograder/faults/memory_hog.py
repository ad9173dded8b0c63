"""Memory filled for real, a bit at a time, past the grader's limit per submission.

Unlike `huge_allocation` (refused at once) every page here is touched, so only a limit on the
whole process tree stops it before the grader's machine runs out. Expected: the sandbox's
memory limit (ResilientExecute.memory_limit, a cgroup) kills the kernel, double_test scores 0
with LimitExceeded naming the limit, and square_test is graded in a new kernel.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    hoard = []
    while True:
        hoard.append(bytearray(64 * 2**20))  # 64 MiB, touched: zero-filled
'''}
EXPECT = {"double_test": ("LimitExceeded", "of memory")}
MAX_SECONDS = 60
