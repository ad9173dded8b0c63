"""nbgrader's exchange for the hub under the system's users (autograder/hub/README.md).

On the JUPYTER_CONFIG_PATH of every learner's and instructor's server when the hub runs with
PARLAB_HUB_SYSTEM_USERS=1, and of `make hub-release`, `hub-collect` and `hub-return`; nbgrader
reads it beside the course's own nbgrader_config.py (which this file leaves as it is).
"""

import os

from parlab.hub.exchange import exchange_settings, instructor_side

c = get_config()  # noqa: F821 -- injected by traitlets when it executes this file

# Where releases, submissions and feedback pass: PARLAB_HUB_EXCHANGE, else the hub's run
# folder's exchange/ (autograder/hub/run/exchange); the course's name in it, PARLAB_HUB_COURSE_ID
# (default "parlab"). The hub hands both to every server it starts.
_root, _course = exchange_settings()
c.Exchange.root = str(_root)
c.CourseDirectory.course_id = _course
# nbgrader's submit, then the submission readable by its learner and the instructors' group
# only (folders 0750, files 0640; the group is PARLAB_HUB_INSTRUCTOR_GROUP, default
# parlab-instructors, which learners are not in): no other learner can read it or put a file
# in it; an instructor collects it as themself, no root needed.
c.ExchangeFactory.submit = "parlab.hub.exchange.PrivateSubmit"
# A collect takes each submission whole or not at all, names those it could not take and then
# fails (exit 1); the next collect takes them (parlab.hub.collect). A fetch leaves a record
# for the instructor's `make status` in the exchange's fetched/ (parlab.hub.records).
c.ExchangeFactory.collect = "parlab.hub.collect.CompleteCollect"
c.ExchangeFactory.fetch_assignment = "parlab.hub.records.RecordedFetch"
# For root and the group's members: nbgrader's setting for instructors who share a course.
# The exchange's folders are root's (the hub made them), given to the group: without it
# nbgrader refuses to release into a folder it does not own; with it, what nbgrader writes
# (releases, collected submissions, autograded notebooks, feedback) is group-writable, so a
# second instructor (or root) can redo a step. Learners keep nbgrader's default.
c.CourseDirectory.groupshared = instructor_side()
# Fetch puts a module into the learner's workspace (the server's root), not into the folder
# the server was started in (the learner's home), which is where nbgrader's "." would be.
if os.environ.get("PARLAB_HUB_WORKSPACE"):
    c.Exchange.assignment_dir = os.environ["PARLAB_HUB_WORKSPACE"]
