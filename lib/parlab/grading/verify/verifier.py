"""Run a notebook's tests in the verifier: the instructor's test code here, the learner's
code only in its sandbox, and a verdict per graded test that no submission can forge.

`verify(nb, source_nb, ...)`:
1. starts a `Host` (a sandboxed kernel) for the submission and hands it `learner_source(nb)`;
2. runs, here, the instructor's imports, definitions and constants (`released_source` of the
   source notebook), with every name the answer cells define bound to an `Answer` (or to its
   value when that is plain data, e.g. a number);
3. runs every graded cell's code (hidden tests included) as the notebook would, with
   `parlab.launch.run` and the learner's names going through the `Session`: whatever the
   learner's code does in its processes, what reaches this process is data, and the
   comparisons, references and verdicts are made here.
A test that already failed in the notebook scores 0 whatever the verifier finds (`settled`):
it is not run again (the grader's time goes to the tests that passed). A test passes when its
code raises nothing; `Verdict.visible` says whether its visible part
did (the notebook may have run only that: `VerifyOptions.withhold_hidden`).
`Verdict.passed` is None when the verifier could not run it at all (its sandbox did not
start), never because of what the learner's code did.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Collection
from typing import Any

from parlab.check._harness import reset_outcomes
from parlab.grading.verify.remote import Host, Session
from parlab.grading.verify.source import (
    answer_names,
    graded_cells,
    learner_source,
    released_source,
    split_hidden,
)
from parlab.grading.verify.verdict import NOT_RUN, Verdict
from parlab.sandboxed import wire
from parlab.sandboxed.host import run_source

__all__ = ["NOT_RUN", "Verdict", "verify"]


def _summary(exc: BaseException) -> str:
    text = exc.summary() if hasattr(exc, "summary") else str(exc)
    return f"{type(exc).__name__}: {text}".strip()


def _run_test(gid: str, code: str, ns: dict[str, Any]) -> Verdict:
    """One test cell's code: its visible part, then its hidden tests, in `ns`."""
    visible, hidden = split_hidden(code)
    for is_hidden, part in ((False, visible), (True, hidden)):
        try:
            exec(compile(part, f"<test {gid}>", "exec"), ns)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - the learner's failure, as a verdict
            return Verdict(gid, False, _summary(exc), visible=is_hidden)
    return Verdict(gid, True, visible=True)


def verify(nb: Any, source_nb: Any, *, cwd: str, manager_class: type,
           cache: dict | None = None, host: Host | None = None,
           settled: Collection[str] = ()) -> dict[str, Verdict]:
    """A Verdict per graded test of `nb` (see the module doc); `source_nb` is the instructor's
    notebook (answers, released cells); `cache` keeps trusted runs across notebooks. `host`:
    one to reuse (a test's, for many answers of one learner), else a fresh one, closed after.
    `settled`: tests that score 0 whatever the verifier says (they failed in the notebook):
    not run again, their verdict NOT_RUN."""
    tests = graded_cells(nb)
    skipped = {gid: Verdict(gid, False, NOT_RUN, visible=False) for gid, _, _ in tests
               if gid in settled}
    if len(skipped) == len(tests):
        return skipped
    own = host is None
    try:
        if host is None:
            host = Host(manager_class, cwd, learner_source(nb))
        else:
            host.request("source", learner_source(nb), timeout=30)
    except Exception as exc:  # noqa: BLE001 - reported as "not verified", with why
        return {gid: Verdict(gid, None, f"the verifier's sandbox did not start: {exc}")
                for gid, _, _ in tests if gid not in skipped}
    session = Session(host, learner_source(source_nb), {} if cache is None else cache)
    verdicts: dict[str, Verdict] = {}
    ns: dict[str, Any] = {"__name__": "__verifier__"}
    out = io.StringIO()
    try:
        with session.bound(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            reset_outcomes()
            run_source(released_source(source_nb), ns, "<released>")  # the instructor's
            names = answer_names(source_nb)
            try:
                ns.update(session.values(names))
            except Exception:  # noqa: BLE001 - the tests then fail on them
                ns.update({name: wire.Answer(name) for name in names})
            for gid, code, _ in tests:
                verdicts[gid] = skipped.get(gid) or _run_test(gid, code, ns)
    finally:
        reset_outcomes()
        if own:
            host.close()
    return verdicts
