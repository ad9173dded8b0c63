"""An answer that passes the visible test and fails a hidden one (no fault, a probe).

Expected: double_test scores 0 with the hidden check's message (the verifier runs the hidden
tests, outside the kernel, and puts their failure in the cell; in a module it does not grade,
the notebook's traceback quotes the hidden line). The feedback test (tests/test_instructor.py)
checks that the learner's feedback HTML shows no hidden test.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    return 6 if isinstance(x, int) and x == 3 else x  # right for the one visible case
'''}
EXPECT = {"double_test": ("AssertionError", "hidden check: double(tensor) failed")}
MAX_SECONDS = 40
