"""`python -m parlab.grading.base.nbgrader_cli ARGS` is `nbgrader ARGS`, started after
parlab.grading.base.startup (about 1 s less per process); parlab.grading runs every nbgrader step
through it (`parlab.grading.base.startup.NBGRADER`)."""

from __future__ import annotations

import sys

from nbgrader.apps.nbgraderapp import main

if __name__ == "__main__":
    sys.exit(main())
