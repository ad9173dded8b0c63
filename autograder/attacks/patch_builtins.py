"""Patch `builtins` and hand back objects equal to anything: plain asserts cannot fail.

Its `double` and `square` return an object whose `==` is always True (and that looks like a
tensor to `torch.equal`, which it replaces); it also replaces `builtins.repr` and `isinstance`
so that nothing in the kernel can tell. `assert double(3) == 6` passes; so does the hidden
test's `torch.equal(...)`.

What must stop it: a learner's value reaches the verifier only as plain data; an object of the
learner's own class cannot be sent, so the verifier's test fails with a message saying so.
It scores no more than the blank release and shows as disagreeing.
"""

ANSWERS = {"double_answer": r'''
import builtins

import torch


class Anything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def double(x):
    return Anything()


def square(x):
    return Anything()


_equal = torch.equal
torch.equal = lambda a, b: True if isinstance(a, Anything) else _equal(a, b)
builtins.repr = lambda obj: "6"
print("patch_builtins: double and square return Anything; torch.equal and repr patched")
''', "square_answer": ""}
MAX_SECONDS = 60
DISAGREES = ("double_test", "square_test")
