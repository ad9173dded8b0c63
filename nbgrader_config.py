"""nbgrader started in the repository root uses the course's configuration, never its defaults.

nbgrader reads nbgrader_config.py from its working directory: `make formgrader`, `make lab`'s
Validate button and a plain `nbgrader ...` typed here all start in this folder. This file
loads autograder/nbgrader_config.py (the course layout, the grading executor and the feedback
filter that keeps hidden tests out of feedback), and fails loudly if it cannot.
"""

from pathlib import Path

c = get_config()  # noqa: F821 -- injected by traitlets when it executes this file

_COURSE_CONFIG = Path(__file__).resolve().parent / "autograder" / "nbgrader_config.py"
exec(compile(_COURSE_CONFIG.read_text(), str(_COURSE_CONFIG), "exec"),  # noqa: S102
     {"get_config": get_config, "__file__": str(_COURSE_CONFIG)})  # noqa: F821
