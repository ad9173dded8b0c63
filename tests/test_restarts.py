"""scripts/train.py under torchrun --max-restarts: a rank killed with SIGKILL mid-run.

One torchrun of 4 processes (DP 2 × TP 2) saves every 3 iterations; the test waits until
rank 0 has finished iteration 5, sends SIGKILL to the worker of rank 1, and lets torchrun
restart the group. The restarted processes load the checkpoint of iteration 3, say that
iterations 4-5 (or 4-6, if 6 ended before the kill landed) were lost, run them again with the
same losses (the same grid restores every bit: weights, Adam, data position), pass --check
on the iterations they ran, and end with the final loss of a run without the fault
(computed here through `parlab.launch.run`, the same code on the same grid). A second
torchrun (2 processes, TP 2) loses a rank in each of its two attempts with --max-restarts 1:
it must end with a non-zero exit and torchrun's report of the signal, within the timeout,
never hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Torchrun, descendants

from parlab.compose import Plan, train
from parlab.launch import run
from parlab.model import LlamaConfig

SCRIPT = ROOT / "scripts" / "train.py"
ITERS, INTERVAL, KILL_AFTER = 8, 3, 5
ARGS = ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--train-iters", str(ITERS), "--check"]


def _workers(pid: int) -> dict[int, int]:
    """{global rank: pid} of the training processes below torchrun `pid`."""
    out = {}
    for child in descendants(pid):
        try:
            if b"train.py" not in Path(f"/proc/{child}/cmdline").read_bytes():
                continue
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        if rank is not None:
            out[rank] = child
    return out


def _progress(directory: Path) -> int:
    try:
        return json.loads((directory / "progress.json").read_text())["iteration"]
    except (OSError, ValueError, KeyError):
        return 0


def _wait(until, deadline: float, what: str, proc: subprocess.Popen, log: Path):
    while time.monotonic() < deadline:
        if (got := until()) is not None and got is not False:
            return got
        if proc.poll() is not None:
            pytest.fail(f"torchrun ended before {what}:\n{log.read_text()}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()}")


def _torchrun(torchrun: Torchrun, tmp: Path, restarts: int, kills, timeout: float, *,
              nproc: int = 4) -> tuple[int, str, list[int]]:
    """Run the script under torchrun, calling each kill(proc, ckpt, log, deadline) in turn
    (each returns the progress at its kill); (exit code, output, progress at each kill).
    The process group is killed whatever happens."""
    ckpt, log = tmp / "ckpt", tmp / "torchrun.log"
    cmd = [*torchrun.cmd, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts",
           str(restarts), str(SCRIPT), *ARGS, "--save", str(ckpt), "--save-interval",
           str(INTERVAL), "--load", str(ckpt)]
    env = torchrun.env(PYTHONUNBUFFERED="1")
    deadline = time.monotonic() + timeout
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        at = [kill(proc, ckpt, log, deadline) for kill in kills]
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun still running after {timeout} s (a hang):\n{log.read_text()}")
    finally:  # torchrun starts each worker in a session of its own: kill them one by one
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, log.read_text(), at


def kill_rank1_after(iteration: int):
    """A kill: once rank 0 has finished `iteration`, SIGKILL the worker of rank 1."""
    def kill(proc, ckpt, log, deadline):
        _wait(lambda: _progress(ckpt) >= iteration, deadline, f"iteration {iteration}",
              proc, log)
        pid = _wait(lambda: _workers(proc.pid).get(1), deadline, "rank 1's pid", proc, log)
        os.kill(pid, signal.SIGKILL)
        return _progress(ckpt)
    return kill


def kill_rank1_on_restart(proc, ckpt, log, deadline):
    """A kill: once the restarted processes have said so, SIGKILL rank 1 again."""
    _wait(lambda: "restart 1 of 1" in log.read_text(), deadline, "the restart", proc, log)
    os.kill(_wait(lambda: _workers(proc.pid).get(1), deadline, "rank 1's pid", proc, log),
            signal.SIGKILL)
    return _progress(ckpt)


def losses_of(output: str) -> list[tuple[int, float]]:
    return [(int(i), float(x)) for i, x in
            re.findall(r"iteration +(\d+)/\d+ .* loss ([0-9.]+) \|", output)]


@pytest.mark.slow
def test_a_killed_rank_costs_the_steps_since_the_last_checkpoint(torchrun, tmp_path):
    start = time.perf_counter()
    code, output, (killed_at,) = _torchrun(torchrun, tmp_path, 1, [kill_rank1_after(KILL_AFTER)],
                                           240)
    print(f"one kill, --max-restarts 1: {time.perf_counter() - start:.0f} s\n{output}")
    assert code == 0, output
    assert "restart 1 of 1 (torchrun --max-restarts): the last one" in output, output
    last = (killed_at // INTERVAL) * INTERVAL
    assert f"resumed from {tmp_path / 'ckpt' / f'iter_{last:07d}'} (iteration {last}" in output
    lost = re.search(r"lost: iterations? (\d+)(?:-(\d+))? \((\d+) in all\)", output)
    assert lost and int(lost[1]) == last + 1, output
    lost_to = int(lost[2] or lost[1])
    assert lost_to >= killed_at and int(lost[3]) == lost_to - last, output
    seen: dict[int, set[float]] = {}
    for i, loss in losses_of(output):
        seen.setdefault(i, set()).add(loss)
    assert sorted(seen) == list(range(1, ITERS + 1)), output
    redone = range(last + 1, lost_to + 1)
    assert all(len(seen[i]) == 1 for i in redone), ("a redone iteration changed", seen)
    clean = run(train, 4, LlamaConfig(), Plan(tp=2, dp=2, micro_batch_size=2), ITERS,
                lr=3e-3, timeout=240)[0]  # the run without the fault
    assert seen[ITERS] == {round(clean[-1], 6)}, (seen[ITERS], clean[-1])
    assert f"(resumed after {last}), tolerance 2e-05: OK" in output, output


@pytest.mark.slow
def test_more_failures_than_restarts_end_the_run(torchrun, tmp_path):
    start = time.perf_counter()
    code, output, _ = _torchrun(torchrun, tmp_path, 1, [kill_rank1_after(1), kill_rank1_on_restart],
                                120, nproc=2)  # TP 2 on 2 processes: two starts, kept short
    print(f"two kills, --max-restarts 1: exit {code} in {time.perf_counter() - start:.0f} s")
    assert code != 0, output
    assert "the last one torchrun allows, a further failure ends the run" in output, output
    assert "Signal 9 (SIGKILL)" in output and "ChildFailedError" in output, output
    assert f"iteration {ITERS}/{ITERS}" not in output, output
