"""Slurm's client commands, as the Slurm engine (parlab.grading.engines.slurm) uses them.

`sbatch` submits and returns the job id; `queued` lists a run's jobs and array tasks still in
the queue with their state (squeue); `final_state` says how a finished array task ended
(scontrol while slurmctld still holds the job, MinJobAge; else sacct where the cluster keeps
accounting); `cancel` ends jobs. Every command runs with the submitter's environment
(SLURM_CONF included), less the run's token: the batch shell must not carry it, so that the
task's clean-up never kills its own shell.
"""

from __future__ import annotations

import os
import re
import subprocess

from parlab.grading.engines.results import RUN_ENV

WAITING = frozenset({"PENDING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "SUSPENDED"})
_EXPLAIN = {
    "TIMEOUT": "killed at its time limit (--time)",
    "OUT_OF_MEMORY": "killed at its memory limit (--mem)",
    "CANCELLED": "cancelled (scancel, or by the administrator)",
    "NODE_FAIL": "its node failed",
    "FAILED": "failed",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "its node did not boot",
    "DEADLINE": "past its deadline",
}


class SlurmError(RuntimeError):
    """A Slurm command failed (not installed, no controller, a refused job)."""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != RUN_ENV}


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{args[0]}: {exc}") from exc
    if check and done.returncode:
        raise SlurmError(f"`{' '.join(args)}` failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[:500]}")
    return done


def sbatch(*args: str) -> int:
    """`sbatch --parsable ARGS`; the job id (an array's, for an array)."""
    out = _run("sbatch", "--parsable", *args).stdout.strip()
    try:
        return int(out.split(";")[0])
    except ValueError:
        raise SlurmError(f"sbatch printed no job id: {out[:200]!r}") from None


def queued(*jobs: int) -> dict[str, str] | None:
    """"<job>" or "<array>_<task>" -> state of each of `jobs` (and their array tasks) still
    queued, pending ones included; None when squeue could not say (the controller busy)."""
    done = _run("squeue", "--noheader", "--array", "--format=%i %T",
                f"--jobs={','.join(map(str, jobs))}", check=False)
    if done.returncode:  # every job gone from the controller's memory reads as an error
        return {} if "invalid job id" in done.stderr.lower() else None
    return dict(line.split()[:2] for line in done.stdout.splitlines() if line.strip())


def final_state(array: int, task: int) -> str:
    """How array task `task` ended ("TIMEOUT", "CANCELLED", ...), or "" when Slurm no longer
    knows."""
    shown = _run("scontrol", "show", "job", "--oneliner", f"{array}_{task}", check=False)
    if shown.returncode == 0 and (found := re.search(r"JobState=(\S+)", shown.stdout)):
        return found.group(1)
    acct = _run("sacct", "--noheader", "--parsable2", "--allocations", "--format=State",
                f"--jobs={array}_{task}", check=False)
    lines = acct.stdout.split() if acct.returncode == 0 else []
    return lines[0].split()[0] if lines else ""


def explain(state: str) -> str:
    """A task's final state, in words."""
    if not state:
        return "ended before it finished (Slurm no longer records how)"
    return f"{state}: {_EXPLAIN[state]}" if state in _EXPLAIN else f"ended {state}"


def cancel(*jobs: int) -> None:
    """scancel the jobs (whole arrays); quietly, since they may have ended meanwhile."""
    if jobs:
        _run("scancel", *map(str, jobs), check=False)
