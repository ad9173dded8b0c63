"""`python -m parlab.grading <command>`: see parlab.grading.cli."""

import sys

from parlab.grading.cli import main

sys.exit(main())
