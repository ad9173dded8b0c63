"""A fork bomb: processes that start processes, without end.

Expected: the sandbox's process limit (ResilientExecute.process_limit, a cgroup) refuses the
forks past it; double_test scores 0 with LimitExceeded naming the limit; the sandbox, and every
process in it, is killed with the kernel, and square_test is graded in a new one.
"""

ANSWERS = {"double_answer": '''\
import os
import time


def double(x):
    children = 0
    try:
        while True:
            if os.fork() == 0:
                while True:
                    try:
                        os.fork()
                    except OSError:
                        time.sleep(3600)
            children += 1
    except OSError as exc:
        raise RuntimeError(f"fork refused after {children} children: {exc}") from exc
'''}
EXPECT = {"double_test": ("LimitExceeded", "limit per submission")}  # processes, or memory first
MAX_SECONDS = 60
