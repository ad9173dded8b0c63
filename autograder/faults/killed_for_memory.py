"""The kernel killed as the kernel's out-of-memory killer does it: SIGKILL, no warning.

(Filling the grader's memory for real would put other processes at risk; SIGKILL is exactly
what the OOM killer sends.) Expected: as for os._exit, double_test scores 0 with KernelDied,
whose message names running out of memory as a likely cause, and square_test is graded.
"""

ANSWERS = {"double_answer": '''\
import os
import signal


def double(x):
    os.kill(os.getpid(), signal.SIGKILL)
'''}
EXPECT = {"double_test": ("KernelDied", "running out of memory")}
MAX_SECONDS = 60
