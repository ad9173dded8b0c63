"""parlab.grading.collect: the instructor's step 2, submissions into submitted/.

- `inbox`: `collect(FROM)`, every handed-in file copied into submitted/<student>/<module>/
  or reported with a line saying why not (`make collect`);
- `match`: which module a notebook belongs to, whatever its file is called;
- `times`: when each was handed in (timestamp.txt, from `TIMES=<csv>`), for late penalties;
- `fake`: made-up students (full marks, blank, half done) to try the workflow and for tests.

May import: parlab.grading.base.
"""
