"""A late-submission penalty for nbgrader: a share of the score per day (or part) late.

nbgrader's own plugin (LateSubmissionPlugin) offers no penalty or a score of zero. This one
takes `share_per_day` of the notebook's score for each started day after the due date, up to
the whole score. Turn it on in autograder/nbgrader_config.py:

    c.AssignLatePenalties.plugin_class = "parlab.grading.autograde.late.PenaltyPerDay"
    c.PenaltyPerDay.share_per_day = 0.1

The due date is the gradebook's (nbgrader db assignment add MODULE --duedate=...); the
submission time is the submission's timestamp.txt (parlab.grading.collect.times).
"""

from __future__ import annotations

import math

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float

DAY_S = 86400.0


class PenaltyPerDay(LateSubmissionPlugin):
    """`share_per_day` of the score per started day late, at most the score."""

    share_per_day = Float(0.1, help="Share of the score taken per started day late "
                          "(0.1: a submission 1.5 days late loses 20 %).").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float,
                                total_seconds_late: float) -> float | None:
        if total_seconds_late <= 0:
            return None
        days = math.ceil(total_seconds_late / DAY_S)
        penalty = min(score, score * self.share_per_day * days)
        self.log.info("%s is %d day(s) late: penalty %g of %g", student_id, days, penalty, score)
        return penalty
