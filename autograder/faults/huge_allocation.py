"""An allocation far beyond memory: 4 PiB, more than any address space holds.

The allocator refuses it at once, whatever the machine's overcommit setting. Expected:
double_test scores 0 with torch's RuntimeError ("can't allocate memory", with the size);
the kernel is unharmed and square_test is graded.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    scratch = torch.empty(2**50)  # 4 PiB of float32
    return 2 * x + 0 * scratch[0]
'''}
EXPECT = {"double_test": ("RuntimeError", "can't allocate memory")}
MAX_SECONDS = 40
