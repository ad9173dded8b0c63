"""A deleted test cell: double_test is gone from the submitted notebook.

Expected: the grader puts the cell back (so the feedback shows it) but does not run it:
double_test scores 0 with TestCellDeleted, which tells the learner to restore it from
course/; the other tests keep their points.
"""

DELETE = ["double_test"]
EXPECT = {"double_test": ("TestCellDeleted", "was deleted from your notebook")}
MAX_SECONDS = 40
