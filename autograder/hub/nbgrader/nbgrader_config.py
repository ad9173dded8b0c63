"""nbgrader's exchange for the hub under the system's users (autograder/hub/README.md).

On the JUPYTER_CONFIG_PATH of every learner's and instructor's server when the hub runs with
PARLAB_HUB_SYSTEM_USERS=1, and of `make hub-release`, `hub-collect` and `hub-return`; nbgrader
reads it beside the course's own nbgrader_config.py (which this file leaves as it is).
"""

import os

from parlab.hub.exchange import exchange_settings

c = get_config()  # noqa: F821 -- injected by traitlets when it executes this file

# Where releases, submissions and feedback pass: PARLAB_HUB_EXCHANGE, else the hub's run
# folder's exchange/ (autograder/hub/run/exchange); the course's name in it, PARLAB_HUB_COURSE_ID
# (default "parlab"). The hub hands both to every server it starts.
_root, _course = exchange_settings()
c.Exchange.root = str(_root)
c.CourseDirectory.course_id = _course
# nbgrader's submit, then the submission made the learner's alone (folders 0700, files 0600):
# no other learner can read it or put a file in it; the instructor collects as root.
c.ExchangeFactory.submit = "parlab.hub.exchange.PrivateSubmit"
# Fetch puts a module into the learner's workspace (the server's root), not into the folder
# the server was started in (the learner's home), which is where nbgrader's "." would be.
if os.environ.get("PARLAB_HUB_WORKSPACE"):
    c.Exchange.assignment_dir = os.environ["PARLAB_HUB_WORKSPACE"]
