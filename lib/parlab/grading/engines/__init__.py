"""parlab.grading.engines: the instructor's step 3 for a class, on whatever does the work.

A class is dealt into shares of (module, student) pairs; each share is graded by plain
`nbgrader autograde` in a course root of its own with its own copy of the gradebook; an engine
is what runs the shares. Everything around it is the same whichever engine ran:

- `grade`: `autograde_parallel`, which selects what changed (`record`), releases the modules
  into the gradebook, hands the shares to an engine, then merges their gradebooks into the
  course's, one writer (`merge`), and returns a `GradeRun` of `Graded` (`results`);
- `share`: one share made ready (`prepare`, `command`), the run's `Job`, and `Engine`, the
  small interface an engine implements: `grade(job, shares)`;
- `local`: `LocalWorkers`, the engine of one machine (`make autograde WORKERS=3`);
- `record`: what was graded from which files, so a re-run grades only what changed.

May import: parlab.grading.base, parlab.grading.sandbox (whether one can be made here) and
parlab.grading.verify (its verdicts, read back from the graded notebooks).
"""
