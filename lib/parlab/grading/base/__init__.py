"""parlab.grading.base: what every step of grading shares.

- `paths`: where the course lives (`REPO_ROOT`, `SOLUTIONS_DIR`, `COURSE_DIR`, ...) and the
  modules in a folder;
- `cells`: nbgrader's marks on a notebook's cells, and the errors the cells ended with;
- `config`: values of the course's nbgrader configuration, as nbgrader would read them;
- `startup`: imported first by parlab.grading (it declines a slow optional import);
- `runner` and `nbgrader_cli`: nbgrader's command line, run as the make targets run it, and
  the scores it records;
- `notebooks` and `widget_sync`: running a notebook as the grader does (nbclient), and
  whether a handed-in file can be read at all;
- `procs`: finding and ending the processes of a grading run.

May import: nothing else of parlab.grading, and nothing of parlab but the standard library's
and nbgrader's own (it is what every other sub-package imports).
"""
