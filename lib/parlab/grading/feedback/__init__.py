"""parlab.grading.feedback: the instructor's step 5, feedback that shows nothing the release
hides.

- `hidden`: `HideHiddenTests` (nbgrader's feedback preprocessor: hidden tests out of the
  cells, their lines out of tracebacks and outputs) and the secret lines it looks for;
- `leakcheck`: the guard on every feedback file nbgrader writes (`FeedbackGuard`), and
  `leaks`, which a test and `make feedback` use to check a page;
- `withhold`: `write_feedback`, `make feedback` itself.

May import: parlab.grading.base.
"""
