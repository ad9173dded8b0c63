"""nbgrader's collect, made whole or told: a submission is collected entirely or not at all.

nbgrader 0.9.6's collect copies each learner's latest submission from the exchange's inbound
straight into `submitted/<student>/<module>/` and stops at the first error. A copy cut short (a
file the instructor cannot read, a full disk, a killed process) leaves a partial folder with
the submission's `timestamp.txt` in it; the next `collect --update` finds that timestamp
current, says "No newer submission to collect" and exits 0, so the partial folder stays and
nothing tells the instructor; and the learners after the failing one are not collected at all.

`CompleteCollect` (set as `ExchangeFactory.collect` in autograder/hub/nbgrader/nbgrader_config.py)
copies each submission into a hidden folder beside its place (`submitted/<student>/.<module>.
collecting`; nbgrader and parlab.grading skip hidden folders) and renames it into place only
once the copy is whole, so that what `submitted/` holds is always a whole submission. A
submission that fails is named with the reason (`NOT COLLECTED <student>: ...`), the others are
collected all the same, and the collect ends with nbgrader's failure (exit status 1). Nothing
of the failed one is left in place, so the next collect (`make hub-collect`) takes it again;
a hidden folder left by a killed collect is removed by the next.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect

__all__ = ["CompleteCollect", "STAGING_SUFFIX"]

STAGING_SUFFIX = ".collecting"


class CompleteCollect(ExchangeCollect):
    """nbgrader's collect (the latest submission per student, `--update` and
    `--before-duedate` as nbgrader reads them), each submission whole or not at all."""

    def copy_files(self) -> None:
        if not self.src_records:
            self.log.warning("No submissions of '%s' for course '%s' to collect",
                             self.coursedir.assignment_id, self.coursedir.course_id)
            return
        self.log.info("Processing %d submissions of '%s' for course '%s'",
                      len(self.src_records), self.coursedir.assignment_id,
                      self.coursedir.course_id)
        failed: list[str] = []
        for record in self.src_records:
            student = record["username"]
            try:
                self._collect_one(record)
            except Exception as exc:   # each failure is reported; the others still go
                failed.append(student)
                self.log.error("NOT COLLECTED %s %s: %s: %s", student,
                               self.coursedir.assignment_id, type(exc).__name__, exc)
        if failed:
            self.fail(f"{len(failed)} of {len(self.src_records)} submissions were not collected "
                      f"({', '.join(sorted(failed))}); nothing of them is in submitted/. Fix "
                      "what is named above (a file you cannot read: ask the learner to submit "
                      "again, or collect as root), then collect again: it takes what is missing")

    def _collect_one(self, record: dict) -> None:
        student, module = record["username"], self.coursedir.assignment_id
        src = Path(self.inbound_path) / record["filename"]
        self._check_owner(student, src)
        dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory, student,
                                               module))
        staging = dest.parent / f".{dest.name}{STAGING_SUFFIX}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():               # a collect killed part-way
            shutil.rmtree(staging)
        updating = dest.is_dir()
        if updating and not self._newer(dest, record):
            what = ("No newer submission to collect" if self.update else
                    "Submission already exists, use --update to update")
            self.log.info("%s: %s %s", what, student, module)
            return
        self.log.info("%s submission: %s %s", "Updating" if updating else "Collecting",
                      student, module)
        try:
            self.do_copy(str(src), str(staging))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if updating:                       # the old one goes only once the new one is whole
            old = dest.parent / f".{dest.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(dest, old)
            os.rename(staging, dest)
            shutil.rmtree(old)
        else:
            os.rename(staging, dest)

    def _newer(self, dest: Path, record: dict) -> bool:
        """nbgrader's rule: copy again with --update when the submission is newer, or with
        --before-duedate when it is another one."""
        existing = self.coursedir.get_existing_timestamp(str(dest))
        new = record["timestamp"]
        if self.update and (existing is None or new > existing):
            return True
        return bool(self.before_duedate and existing != new)

    def _check_owner(self, student: str, src: Path) -> None:
        """nbgrader's warning when the folder's owner is not the student it names."""
        if not self.check_owner:
            return
        try:
            owner = pwd.getpwuid(src.stat().st_uid).pw_name
        except KeyError:
            owner = "unknown id"
        if owner != student:
            self.log.warning("%s claims to be submitted by %s but is owned by %s; cheating "
                             "attempt? (CollectApp.check_owner)", src, student, owner)
