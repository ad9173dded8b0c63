"""Files written until the disk is full: many of them, each under the limit per file.

Expected: the sandbox's /tmp is a tmpfs of ResilientExecute.disk_limit bytes, so the writes
fail there with "No space left on device" and the grader's own disk is untouched;
double_test scores 0 with LimitExceeded naming the limit; square_test is graded.
"""

ANSWERS = {"double_answer": '''\
import os


def double(x):
    block = b"x" * 2**20
    for i in range(100_000):
        with open(f"/tmp/fill-{i}", "wb") as f:
            for _ in range(16):
                f.write(block)
'''}
EXPECT = {"double_test": ("LimitExceeded", "limit for /tmp")}
MAX_SECONDS = 60
