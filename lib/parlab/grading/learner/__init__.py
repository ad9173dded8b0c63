"""parlab.grading.learner: the learner's side of grading.

- `selfcheck`: the visible tests of one's own notebook, judged as the grader will
  (`make check`);
- `in_notebook`: `standing()`, the same table printed by a notebook's last cell;
- `workspace`: a learner's copies of the released notebooks across releases (`make lab`
  says which are out of date; `make update` carries answers into a new release);
- `validate_button`: nbgrader's Validate button as a learner meets it in JupyterLab.

May import: parlab.grading.base, parlab.grading.autograde (the executor the grader uses).
"""
