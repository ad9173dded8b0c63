"""One file written far past the limit per file, in the submission's own folder.

Expected: the kernel's RLIMIT_FSIZE (ResilientExecute.file_limit) stops the write ("File too
large", or SIGXFSZ ends the kernel); double_test scores 0 with LimitExceeded naming the
limit; square_test is graded.
"""

ANSWERS = {"double_answer": '''\
import signal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get the error, not the signal


def double(x):
    block = b"x" * 2**20
    with open("big.bin", "wb") as f:
        while True:
            f.write(block)
'''}
EXPECT = {"double_test": ("LimitExceeded", "larger than")}
MAX_SECONDS = 60
