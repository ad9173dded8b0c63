"""The verifier: every graded test's score decided in a process that never ran learner code.

A test cell scores when it raises nothing, and in the notebook it runs in the learner's own
kernel, after the learner's cells: a submission can patch the checks, the launcher or
IPython there and pass without earning it. So the grader runs every test again here
(`verify`): the instructor's test code in the grader's process, the learner's code only in
processes of the submission's sandbox (parlab.sandboxed), which send back plain data; the
references and the comparisons are made here. With ResilientExecute's `verify = True`
(autograder/nbgrader_config.py) a test scores only when the verifier passes it too (`apply`:
it takes points away, never gives them), and where the notebook's own check disagreed is
recorded, for the autograde output and `make report`.

- `source`: what of a notebook runs where, read as source text;
- `remote`: the sandboxed host, and the stand-ins for `parlab.launch.run` and the learner's
  names while the tests run;
- `verdict`: `Verdict`, the verifier's word on one test (plain data);
- `verifier`: `verify`, a `Verdict` per graded test;
- `apply`: the verdicts written into the graded notebook.

May import: parlab.grading.base (cells, processes); and of the rest of parlab the checks,
the launcher and parlab.sandboxed, whose stand-ins it drives.
"""

from parlab.grading.verify.verdict import Verdict

__all__ = ["Verdict"]  # `verify` is in .verifier: it imports torch and the checks, which the
# grader's other commands (release, export, feedback) never need
