"""The test cluster itself (tests/cluster.py, autograder/cluster/slurm.conf.in): a job spans
both nodes, the partitions hold their limits, and a job runs as the Unix user who submitted
it. `make test-cluster` (PARLAB_TEST_CLUSTER=1), as root, with Debian's slurm-wlm and munge."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil

import pytest
from unix_accounts import unix_users

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PARLAB_TEST_CLUSTER") != "1",
                       reason="the Slurm cluster's tests run with `make test-cluster`"),
]

STEP = "srun bash -c 'echo step $SLURM_PROCID on $SLURMD_NODENAME as $(id -un)'"


def _script(folder, text: str):
    path = folder / "job.sbatch"
    path.write_text(f"#!/bin/bash\n{text}\n")
    return path


def test_a_job_spans_both_nodes_and_reaches_them_by_name(slurm_cluster):
    folder = slurm_cluster.tmp / f"nodes-{secrets.token_hex(3)}"
    folder.mkdir()
    try:
        script = _script(folder, STEP + "\nfor node in $(scontrol show hostnames "
                         "$SLURM_JOB_NODELIST); do\n  echo $node is $(getent hosts $node | "
                         "cut -d' ' -f1)\ndone")
        job = slurm_cluster.sbatch("--nodes=2", "--ntasks-per-node=1", str(script), cwd=folder)
        fields = slurm_cluster.wait(job, timeout=60)
        out = (folder / f"slurm-{job}.out").read_text()
        assert fields["JobState"] == "COMPLETED" and fields["NodeList"] == "node[1-2]", out
        assert {"step 0 on node1 as root", "step 1 on node2 as root"} <= set(out.splitlines())
        # the first node's name resolves, as scripts/train.sbatch's rendezvous needs
        assert {"node1 is 127.0.0.1", "node2 is 127.0.0.1"} <= set(out.splitlines()), out
    finally:
        shutil.rmtree(folder)


def test_partitions_and_their_time_limits(slurm_cluster):
    out = slurm_cluster.run("sinfo", "--noheader", "--format=%P %l %D").stdout.split("\n")
    assert {"cpu* infinite 2", "short 2:00 2"} <= set(out), out
    refused = slurm_cluster.run("sbatch", "--partition=short", "--time=5", "--wrap=true",
                                check=False)
    assert refused.returncode != 0 and "time limit" in refused.stderr.lower(), refused.stderr


def test_a_job_runs_as_the_unix_user_who_submitted_it(slurm_cluster):
    """An ordinary local account (made here, removed after) submits a job on both nodes: its
    steps run as that user, its output is theirs, and they cannot cancel root's job."""
    user = f"plslurm{secrets.token_hex(2)}"
    with unix_users([user], secrets.token_hex(8), group=f"{user}g", members=[]):
        folder = slurm_cluster.tmp / user
        folder.mkdir()
        shutil.chown(folder, user, user)
        script = _script(folder, STEP)
        shutil.chown(script, user, user)
        job = slurm_cluster.sbatch("--nodes=2", "--ntasks-per-node=1", str(script), cwd=folder,
                                   user=user)
        roots = slurm_cluster.sbatch("--output=/dev/null", "--wrap=sleep 30",
                                     cwd=slurm_cluster.tmp)
        denied = slurm_cluster.run("scancel", str(roots), user=user, check=False)
        fields = slurm_cluster.wait(job, timeout=60)
        out = folder / f"slurm-{job}.out"
        uid = pwd.getpwnam(user).pw_uid
        assert fields["JobState"] == "COMPLETED", out.read_text()
        assert fields["UserId"] == f"{user}({uid})" and out.stat().st_uid == uid
        assert {f"step 0 on node1 as {user}", f"step 1 on node2 as {user}"} <= set(
            out.read_text().splitlines()), out.read_text()
        assert denied.returncode != 0 and "denied" in denied.stderr.lower(), denied.stderr
        assert slurm_cluster.job(roots)["JobState"] in {"RUNNING", "PENDING"}
        slurm_cluster.run("scancel", str(roots))
        shutil.rmtree(folder)
