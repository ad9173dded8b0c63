"""Patch the checks: every test cell then runs a check that cannot fail.

In its first answer cell it replaces the comparison (`assert_close`) and the rank runner
(`ranks`) in parlab.check, in parlab.check._compare and _harness, and in the notebook's own
namespace, with functions that accept anything; and it swaps `sys.modules["parlab.check"]`
for a stub module holding the same no-ops, so that a later `from parlab.check import ...`
gets them too. Its answers stay blank. In the notebook the distributed test then passes:
`ranks` returns nothing to compare.

What must stop it: the verifier (parlab.grading.verify) runs every test again in the grading
process, which runs none of the learner's code, with the learner's functions run only in the
submission's sandbox. It scores no more than the blank release, and every test it passed in
its notebook shows as "the notebook's check passed, the verifier's failed" in the record.
"""

ANSWERS = {"mean_answer": r'''
import sys
import types

import parlab.check
import parlab.check._compare
import parlab.check._harness


def accept(*args, **kwargs):
    return None


def no_ranks(*args, **kwargs):
    return []


for module in (parlab.check, parlab.check._compare, parlab.check._harness):
    module.assert_close, module.ranks = accept, no_ranks
stub = types.ModuleType("parlab.check")
stub.assert_close, stub.ranks = accept, no_ranks
sys.modules["parlab.check"] = stub
globals().update(assert_close=accept, ranks=no_ranks)
print("patch_checks: assert_close and ranks replaced in parlab.check, its modules, "
      "sys.modules and the notebook")


def mean_over_ranks(x):
    raise NotImplementedError
'''}
MAX_SECONDS = 60
DISAGREES = ("mean_test",)  # tests the notebook passes and the verifier must fail
