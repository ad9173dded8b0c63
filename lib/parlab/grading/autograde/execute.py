"""The autograder's executor: every submission is graded, whatever the learner's code does.

nbgrader's own `Execute` drops a whole submission when the kernel dies (`os._exit`, killed for
memory) or ignores the interrupt sent on a cell timeout (a loop ignoring SIGINT). Instead,
`ResilientExecute` (autograde's executor in autograder/nbgrader_config.py; `make check` too):

- records a readable error on the cell that killed or hung the kernel, kills the kernel's
  whole session (ranks run in their own process groups, not sessions), starts a new kernel,
  silently re-runs the earlier cells that succeeded, and goes on, so later tests still grade;
- starts the kernel again (START_RETRIES times) when it dies before answering, before any
  cell ran in it, where nbgrader would drop the submission; then gives up with a message;
- bounds the notebook by `submission_timeout` s (each cell by `timeout`); cells it did not
  reach get an error, so they score 0 (nbgrader gives a test cell with no output full marks);
- notes, on a NameError for a name that an earlier cell defines, that this cell did not
  finish (parlab.grading.autograde.names): after `os._exit` in an answer cell, say, the later tests
  point the learner at that cell;
- scores a test cell the learner deleted (put back by parlab.grading.autograde.overwrite) 0 with a
  message instead of running it, and notes in an edited locked test cell that it ran as
  released; grades a notebook flagged unreadable (parlab.grading.engines.share) without a kernel.

Throughput (autograder/README.md, "Grading a large class"): with `warm_kernels` each kernel is
forked from a template that has imported torch and the checks (parlab.grading.autograde.warm); with
`skip_after_last_test` no code cell after the last graded one runs; the kernel is shut down
at once when the notebook is done (every output is in by then); `profile` records where the
time went. tests/test_warm.py and tests/test_class_bench.py prove them score-neutral.

Cell outcomes, by ename: CellTimeoutError (interrupted after `timeout`), KernelUnresponsive,
KernelDied, SubmissionTimeLimit, NotRun, TestCellDeleted, InvalidNotebook.
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from typing import Any

import nbformat
from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer, default

from parlab.grading.autograde.limits import LIMIT_ENAME, SandboxOptions
from parlab.grading.autograde.names import note_undefined_name
from parlab.grading.autograde.outputs import OutputLimits
from parlab.grading.autograde.profile import Timings, phase_of
from parlab.grading.base.cells import (
    META,
    after_last_graded,
    error_output,
    has_error,
    restored,
)
from parlab.grading.base.procs import KERNEL_ENV, kill_kernel_tree
from parlab.grading.base.widget_sync import OUTPUT_WIDGETS
from parlab.grading.verify.apply import VerifyOptions

START_RETRIES = 2  # a kernel that dies before it answers is started again, this many times


class _Restart(Exception):
    """The kernel is gone or hung: start a new one and go on."""


class ResilientExecute(OutputLimits, VerifyOptions, SandboxOptions, Execute):
    """nbgrader's Execute, surviving dead and unresponsive kernels (see the module doc)."""

    submission_timeout = Integer(
        900, help="Most seconds one notebook may run in total, restarts included; cells not "
        "reached by then score 0. Each cell is also bounded by `timeout`.").tag(config=True)
    max_restarts = Integer(
        3, help="Kernel restarts allowed per notebook before the rest is left unrun."
    ).tag(config=True)
    run_restored_tests = Bool(
        False, help="Run a test cell that the learner deleted (and nbgrader put back) instead "
        "of scoring it 0.").tag(config=True)
    warm_kernels = Bool(
        False, help="Fork each kernel from a template that has imported torch and the checks "
        "(parlab.grading.autograde.warm) instead of starting a new Python.").tag(config=True)
    profile = Bool(
        False, help="Record wall and CPU seconds per phase in the notebook's metadata "
        "(parlab.grading.autograde.profile).").tag(config=True)
    skip_after_last_test = Bool(
        True, help="Do not run the code cells after the last graded cell: nothing they do can "
        "change a score (a demonstration, the standing() cell).").tag(config=True)

    @default("shutdown_kernel")
    def _shutdown_kernel_default(self) -> str:
        return "immediate"  # every output is in: a graceful shutdown only waits (~1-3 s)

    @default("iopub_timeout")
    def _iopub_timeout_default(self) -> int:
        return 10  # after an interrupt: how long a kernel may take to become idle again

    # --- one notebook ---------------------------------------------------------------------
    def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> Any:
        NotebookClient.__init__(self, nb, km)
        self.widget_registry = dict(OUTPUT_WIDGETS)  # parlab.grading.base.widget_sync
        if self.warm_kernels or self.sandbox:  # parlab.grading.autograde.limits
            self.kernel_manager_class = self.manager_class(self.warm_kernels)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        start = time.monotonic()
        self._deadline = start + self.submission_timeout
        self._sid: int | None = None
        self._token: str | None = None
        self.restarts = 0
        self._timings = Timings(self.profile)
        unreadable = self.nb.metadata.get(META, {}).get("unreadable")
        if unreadable:  # nothing to run: every test gets the reason
            self._finish(0, "InvalidNotebook", unreadable)
            self.nb.metadata[META]["grading"] = {"seconds": 0.0, "restarts": 0}
            return self.nb, self.resources
        end = self._end()
        withheld = self.withhold_hidden(resources)  # parlab.grading.verify.apply
        index, why_stopped = self._run_cells(end, resources)
        if why_stopped:
            self._finish(index, "NotRun", f"not run: grading stopped because {why_stopped}.")
        if self.verify:
            self.verify_graded(resources, withheld)
            self._timings.mark("verifier")
        self.set_widgets_metadata()
        self.nb.metadata.setdefault(META, {})["grading"] = {
            "seconds": round(time.monotonic() - start, 1), "restarts": self.restarts,
            "not_run_after_last_test": sum(c.cell_type == "code" for c in self.nb.cells[end:])}
        if self.profile:
            self.nb.metadata[META]["grading"]["profile"] = self._timings.record()
        return self.nb, self.resources

    def _run_cells(self, end: int, resources: Any) -> tuple[int, str | None]:
        """Run cells [0, end) in as many kernels as it takes; (where it stopped, why or None)."""
        succeeded: list[int] = []  # cells to re-run after a restart
        index, why_stopped, failed_starts = 0, None, 0
        while index < end and why_stopped is None:
            if time.monotonic() >= self._deadline:
                why_stopped = self._limit_text()
                break
            started, km = False, None
            try:
                mark = uuid.uuid4().hex
                self._token = f"{KERNEL_ENV}={mark}"
                self._timings.start()
                with self.setup_kernel(env=dict(os.environ, **{KERNEL_ENV: mark})):
                    started, km = True, self.km  # nbclient drops self.km when done
                    self._sid = self._kernel_session()
                    info = self.wait_for_reply(self.kc.kernel_info()) or {}
                    self.nb.metadata["language_info"] = info.get("content", {}).get(
                        "language_info", {"name": "python"})
                    self._timings.mark("kernel start", self._sid)
                    why_stopped = self._replay(succeeded)
                    self._timings.mark("replay")
                    while why_stopped is None and index < end:
                        if time.monotonic() >= self._deadline:
                            why_stopped = self._limit_text()
                            break
                        if self._timed_run(index, resources):
                            succeeded.append(index)
                        index += 1
            except _Restart:
                index += 1
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    why_stopped = (f"the kernel had to be restarted {self.restarts} times, the "
                                   f"most allowed is {self.max_restarts}")
            except RuntimeError as exc:  # "Kernel died before replying to kernel_info"
                if started:
                    raise
                # before any code of this notebook ran in it (a port taken by another process
                # between being chosen and bound, say): start another, a few times
                failed_starts += 1
                if failed_starts > START_RETRIES:
                    why_stopped = f"the kernel did not start, {failed_starts} times ({exc})"
            finally:
                kill_kernel_tree(self._sid, self._token)
                if (close := getattr(km, "close_sandbox", None)) is not None:
                    close()  # also when the kernel died (parlab.grading.autograde.kernels)
                self._timings.mark("shutdown")
        return index, why_stopped

    def _timed_run(self, index: int, resources) -> bool:
        """`_run_one`, its time charged to the cell's phase (parlab.grading.autograde.profile)."""
        cell = self.nb.cells[index]
        if cell.cell_type != "code" or not self.profile:
            return self._run_one(index, resources)
        first = next(i for i, c in enumerate(self.nb.cells) if c.cell_type == "code") == index
        try:
            return self._run_one(index, resources)
        finally:
            self._timings.mark(phase_of(cell, first))

    def _end(self) -> int:
        """One past the last cell to run: after the last graded cell when skip_after_last_test
        (no later cell can change a score), else the notebook's end."""
        if not self.skip_after_last_test:
            return len(self.nb.cells)
        return after_last_graded(self.nb.cells)

    def _run_one(self, index: int, resources) -> bool:
        """Run cell `index`; True if it ran clean. Raises _Restart when the kernel is lost."""
        cell = self.nb.cells[index]
        if cell.cell_type != "code":
            return False
        if restored(cell) == "deleted" and not self.run_restored_tests:
            cell.outputs = [error_output("TestCellDeleted", self._deleted_text(cell))]
            return False
        self._last_timeout = self.timeout
        self._hits = self.hits(self.km)
        try:
            self.preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._lose_kernel(index, "KernelDied", (
                "the kernel died while running this cell (os._exit or exit() in your code, "
                "a crash, or the machine running out of memory?). The grader started a new "
                "kernel, re-ran the cells above that had succeeded, and went on with the next "
                "cell; this one scores 0. Run it on its own to see what ends the process."))
        except CellTimeoutError:
            self._lose_kernel(index, "KernelUnresponsive", (
                f"this cell ignored the interrupt after {self._last_timeout} s: it was "
                "still running when the grader stopped it and did not stop (a loop that "
                "catches KeyboardInterrupt or ignores SIGINT?). The grader killed the kernel, "
                "started a new one, re-ran the cells above that had succeeded, and went on; "
                "this one scores 0."))
        self.nb.cells[index] = cell  # execute_cell stores the cell back; keep our object
        if (limit := self._limit_hit(cell)) is not None:
            cell.outputs.append(error_output(LIMIT_ENAME, limit))
        note_undefined_name(self.nb.cells, index)
        if restored(cell) == "edited":
            cell.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=(
                "Note: this test cell had been edited in your notebook; the grader ran it as "
                "released.\n")))
        return not has_error(cell)

    def _limit_hit(self, cell: Any) -> str | None:
        """The message for a sandbox limit this cell hit (autograde.limits), or None."""
        text = "\n".join(str(o.get("evalue", "")) + str(o.get("text", ""))
                         for o in cell.get("outputs", []))
        return self.limit_error(getattr(self, "_hits", {}), self.hits(self.km), text)

    def _lose_kernel(self, index: int, ename: str, evalue: str) -> None:
        cell = self.nb.cells[index]
        if (limit := self._limit_hit(cell)) is not None:
            ename, evalue = LIMIT_ENAME, limit + " The grader started a new kernel and went on."
        cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
        cell.outputs.append(error_output(ename, evalue))
        self.log.warning("%s in cell %d (%s): restarting the kernel", ename, index,
                         cell.metadata.get("nbgrader", {}).get("grade_id", "no grade id"))
        kill_kernel_tree(self._sid, self._token)
        raise _Restart

    def _replay(self, indices: list[int]) -> str | None:
        """Re-run, silently, cells that succeeded before a restart; a reason if one fails."""
        for index in indices:
            original = self.nb.cells[index]
            shadow = copy.deepcopy(original)
            try:
                self.execute_cell(shadow, index, store_history=False)
            except (DeadKernelError, CellTimeoutError) as exc:
                return f"re-running cell {index} after a restart failed ({type(exc).__name__})"
            finally:
                self.nb.cells[index] = original
            if has_error(shadow):
                return f"re-running cell {index} after a restart raised an error"
        return None

    def _finish(self, start: int, ename: str, evalue: str) -> None:
        """Give every code cell from `start` on that has no error one, so it scores 0."""
        for cell in self.nb.cells[start:]:
            if cell.cell_type == "code" and not has_error(cell):
                cell.outputs = list(cell.get("outputs", [])) + [error_output(ename, evalue)]

    # --- timeouts ---------------------------------------------------------------------------
    def _get_timeout(self, cell):
        """The cell's limit, cut short by what is left of the submission's time."""
        per_cell = super()._get_timeout(cell)
        deadline = getattr(self, "_deadline", None)
        if deadline is None:
            return per_cell
        left = max(1, int(deadline - time.monotonic()))
        return left if per_cell is None else min(per_cell, left)

    async def _async_handle_timeout(self, timeout, cell=None):
        self._last_timeout = timeout
        if time.monotonic() >= getattr(self, "_deadline", float("inf")) - 0.5:
            ename = "SubmissionTimeLimit"
            evalue = self._limit_text() + "; this cell was interrupted"
        else:
            ename = "CellTimeoutError"
            evalue = (f"this cell was still running after {timeout} s, the grader's limit per "
                      "cell, and was interrupted. An endless loop, or a wait that never ends? "
                      "Run it yourself and see where it spends its time (interrupt the kernel "
                      "to get a traceback).")
        self.error_on_timeout = {"ename": ename, "evalue": evalue,
                                 "traceback": [f"{ename}: {evalue}"]}
        return await super()._async_handle_timeout(timeout, cell)

    def _limit_text(self) -> str:
        return (f"the notebook ran past {self.submission_timeout} s, the grader's limit for a "
                "whole submission")

    # --- helpers ------------------------------------------------------------------------------
    def _kernel_session(self) -> int | None:
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        try:
            sid = os.getsid(pid) if pid else None
        except OSError:
            return None
        return sid if sid == pid else None  # only a kernel that leads its own session

    @staticmethod
    def _deleted_text(cell) -> str:
        meta = cell.metadata.get("nbgrader", {})
        points = float(meta.get("points", 0))
        worth = f"{points:g} point" + ("" if points == 1 else "s")
        return (f"this test cell ({meta.get('grade_id')}, worth {worth}) was "
                "deleted from your notebook, so it was not run and scores 0. Put it back "
                "(copy it from the released notebook in course/) and submit again.")

