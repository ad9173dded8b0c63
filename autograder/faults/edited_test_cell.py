"""An edited locked test cell: a wrong answer, and its test replaced by `pass`.

Expected: the grader runs the test as released (nbgrader restores locked cells from the
gradebook), so double_test scores 0 with the real check's message, and a note in the cell
says it had been edited; the other tests keep their points.
"""

ANSWERS = {"double_answer": '''\
def double(x):
    return x + 1
'''}
EDIT_TESTS = {"double_test": "pass  # the test that was here always failed"}
EXPECT = {"double_test": ("AssertionError", "double(3) should be 6, got 4")}
NOTE = {"double_test": "had been edited"}
MAX_SECONDS = 40
