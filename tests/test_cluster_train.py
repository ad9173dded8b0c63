"""scripts/train.sbatch on a test cluster (tests/cluster.py): module 08's Llama on 2 nodes
× 2 ranks over gloo is told that its time is nearly up (SIGUSR1 to the batch shell, as
`#SBATCH --signal=B:USR1@120` sends it), saves, requeues itself, resumes in a second
allocation, and ends with the loss of every iteration of a run on one device that never
stopped. `make test-cluster` (PARLAB_TEST_CLUSTER=1); about a minute.

It runs on a cluster of its own with proctrack/pgid, not on the session's (proctrack/
linuxproc): there a signal to a job step reaches the step's tasks only, the torchrun agents,
as proctrack/cgroup does on a real cluster, so the ranks hear of it only through torchrun.
With linuxproc every process of the step is signalled, and a script whose torchrun never
passes SIGUSR1 on would pass this test and fail on a real cluster."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time

import cluster
import pytest
from conftest import ROOT

from parlab.compose import TOLERANCE, train_single
from parlab.model import LlamaConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_CLUSTER") != "1",
                       reason="the Slurm cluster's tests run with `make test-cluster`"),
]

ITERS = 20
ARGS = ["--tensor-model-parallel-size", "2", "--global-batch-size", "8", "--train-iters",
        str(ITERS), "--check"]
LOSS = re.compile(rf"^iteration +(\d+)/{ITERS} .* loss ([0-9.]+) \|", re.MULTILINE)


@pytest.fixture(scope="module")
def tasks_only_cluster():
    """A test cluster where a step's signals reach its tasks only (proctrack/pgid)."""
    why = cluster.missing()
    if why:
        pytest.skip(f"no Slurm test cluster: {why}")
    with cluster.running_cluster(proctrack="proctrack/pgid") as running:
        yield running


def _wait_for(path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {text!r} in {path} after {timeout} s:\n"
                               f"{path.read_text() if path.exists() else '(no file)'}")
        time.sleep(0.2)


def test_a_run_requeued_at_its_time_limit_resumes_with_the_losses_of_one_that_never_stopped(
        tasks_only_cluster):
    slurm = tasks_only_cluster
    work = slurm.tmp / f"train-{secrets.token_hex(3)}"
    work.mkdir()
    log = work / "train.out"
    env = {"CKPT": str(work / "ckpt"), "RDZV_PORT": str(cluster.free_ports(1)[0])}
    try:
        # as the README says: from the repository's root (the log and checkpoints elsewhere)
        job = slurm.sbatch(f"--output={log}", f"--export=ALL,{_pairs(env)}",
                           "scripts/train.sbatch", *ARGS, cwd=ROOT)
        _wait_for(log, f"iteration    2/{ITERS}", timeout=180)
        slurm.run("scancel", "--batch", "--signal=USR1", str(job))
        fields = slurm.wait(job, timeout=240)
        out = log.read_text()
        said = f"job {fields['JobState']}, exit {fields['ExitCode']}, " \
               f"{fields['Restarts']} requeue(s); its log:\n{_tidy(out)}"
        assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), said
        stopped = re.search(rf"SIGUSR1: stopped after iteration (\d+) of {ITERS}, saved", out)
        assert stopped and fields["Restarts"] == "1", said
        assert f"requeueing job {job}" in out and f"allocation 2 of job {job}" in out, said
        resumed = f"iter_{int(stopped[1]):07d} (iteration {stopped[1]}, saved on DP 2 × TP 2"
        assert resumed in out, said
        losses = [(int(i), float(loss)) for i, loss in LOSS.findall(out)]
        # each iteration once: a resume from an earlier checkpoint, or from none, repeats some
        assert [i for i, _ in losses] == list(range(1, ITERS + 1)), said
        single = train_single(LlamaConfig(), ITERS, global_batch_size=8, lr=3e-3)
        gaps = [abs(loss - ref) for (_, loss), ref in zip(losses, single, strict=True)]
        worst = max(range(ITERS), key=gaps.__getitem__)
        assert gaps[worst] <= TOLERANCE + 1e-6, (  # the log prints 6 decimals
            f"iteration {worst + 1}: loss {losses[worst][1]:.6f}, one device "
            f"{single[worst]:.6f}\n{said}")
        assert f"tolerance {TOLERANCE:.0e}: OK" in out, said  # the job's own --check
    finally:
        slurm.cancel_all()  # after a failure: nothing writes to `work` any more
        shutil.rmtree(work)


NOISE = re.compile(r"^(W\d{4} |\[W\d{4} |frame #|Exception raised from|<omitting)")


def _tidy(out: str, lines: int = 40) -> str:
    """The log without torchrun's warnings and C++ stack frames, its last `lines` lines."""
    kept = [line for line in out.splitlines() if not NOISE.match(line)]
    return "\n".join(kept[-lines:])


def _pairs(env: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in env.items())
