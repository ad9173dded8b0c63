"""Learners' servers as Slurm jobs (PARLAB_HUB_SPAWNER=slurm in the hub's configuration).

    import batchspawner                      # registers its API on the hub: without it, 404
    c.JupyterHub.spawner_class = "wrapspawner.ProfilesSpawner"
    c.ProfilesSpawner.profiles = [("CPU only", "cpu", SlurmJobSpawner, {"req_gres": ""}), ...]

batchspawner's SlurmSpawner submits a learner's server as a batch job (`sbatch` as the
learner, through its `exec_prefix`, `sudo -E -u <learner>`), polls `squeue` until the job runs,
and learns the server's port from the job itself (`batchspawner-singleuser` picks one on the
node and posts it to the hub's /hub/api/batchspawner). `scancel` ends it when the server is
stopped, by the learner, the idle culler or the hub's own stop. `SlurmJobSpawner` adds what
batchspawner's users report missing:

- the hub reaches the node at its NodeAddr (`scontrol show node`), as slurmctld does, not at
  the node's name, which need not resolve on the hub (several slurmd on one host, a DNS the
  nodes alone see);
- the learner sees the wait: the spawn page says how long their job has been in the queue
  and Slurm's reason (Priority, Resources, ...), up to the spawner's `start_timeout`;
- a job that cannot start is told to them in Slurm's words, never a spinner until the
  timeout: sbatch's refusal at submission (a GPU profile on a cluster without that GRES), a
  pending reason that no wait resolves (the job is cancelled), or a job that ended before its
  server started (its state, reason, exit code and the last lines of its log).

Only this file imports batchspawner; the hub's configuration imports it under
PARLAB_HUB_SPAWNER=slurm alone.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from batchspawner import JobStatus, SlurmSpawner, format_template
from tornado import web
from traitlets import Unicode

__all__ = ["SlurmJobSpawner", "JobProblem", "HOPELESS", "job_fields"]

# Pending reasons that no wait resolves: the job asks for what the cluster or the learner's
# account cannot give (squeue's %r; Slurm's "Job Reason Codes").
HOPELESS = frozenset({
    "BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
    "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied", "JobHeldAdmin",
    "QOSMaxWallDurationPerJobLimit",
})


class JobProblem(web.HTTPError):
    """A server's job that will not serve; JupyterHub shows the learner `jupyterhub_message`
    (on the spawn page, the progress line or the API's answer), not "Unhandled error"."""

    def __init__(self, message: str) -> None:
        super().__init__(500, log_message=message)
        self.jupyterhub_message = message


def job_fields(text: str) -> dict[str, str]:
    """`scontrol show ... --oneliner`'s Key=Value fields (values without spaces)."""
    return dict(re.findall(r"(\w+)=(\S*)", text))


class SlurmJobSpawner(SlurmSpawner):
    """SlurmSpawner that reaches the node by its address, shows the queue's wait and reports
    a job that cannot start with Slurm's reason (see the module's docstring)."""

    # squeue's state, batch host and reason: "PENDING n/a Priority", "RUNNING node1 None"
    batch_query_cmd = Unicode("squeue -h -j {job_id} -o '%T %B %r'").tag(config=True)
    state_exechost_re = Unicode(r"^\S+\s+(\S+)").tag(config=True)
    node_query_cmd = Unicode("scontrol show node --oneliner {node}").tag(config=True)
    job_show_cmd = Unicode("scontrol show job --oneliner {job_id}").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._addresses: dict[str, str] = {}
        self._queued_at = 0.0
        self._hopeless = ""

    async def _as_learner(self, template: str, **more: str) -> str:
        """A Slurm command as the learner (the spawner's exec_prefix), its output."""
        subvars = {**self.get_req_subvars(), **more}
        return await self.run_command(" ".join((format_template(self.exec_prefix, **subvars),
                                                format_template(template, **subvars))))

    # --- where the job runs -------------------------------------------------------------
    async def query_job_status(self) -> JobStatus:
        status = await super().query_job_status()
        reason = (self.job_status or "").split(maxsplit=2)[2:] or [""]
        word = reason[0].strip("(),").split(",")[0]
        if status == JobStatus.PENDING and word in HOPELESS:
            self._hopeless = word
            await self.cancel_batch_job()
            return JobStatus.NOTFOUND
        node = re.search(self.state_exechost_re, self.job_status or "")
        if status == JobStatus.RUNNING and node and node[1] not in self._addresses:
            try:
                shown = job_fields(await self._as_learner(self.node_query_cmd, node=node[1]))
            except RuntimeError:
                shown = {}
            self._addresses[node[1]] = shown.get("NodeAddr") or node[1]
        return status

    def state_gethost(self) -> str:
        node = super().state_gethost()
        return self._addresses.get(node, node)

    # --- start, with the wait shown and a failure explained ---------------------------------
    async def submit_batch_script(self) -> str:
        try:
            job: str = await super().submit_batch_script()
        except RuntimeError as exc:
            raise JobProblem(f"Slurm refused your server's job: {exc}. The profile asks for "
                             "what this cluster cannot give: choose another, or tell your "
                             "instructor.") from None
        self._queued_at = time.monotonic()
        return job

    async def start(self) -> tuple[str, int]:
        """batchspawner's start, except that a job which ends, or can never start, before its
        server answers raises with Slurm's reason at once."""
        self.ip = self.traits()["ip"].default_value
        self.port = self.traits()["port"].default_value
        if self.server:
            self.server.port = self.port
        self._hopeless = ""
        job = await self.submit_batch_script()
        while (status := await self.query_job_status()) != JobStatus.RUNNING:
            if status == JobStatus.NOTFOUND:
                raise JobProblem(await self._ended(job))
            await asyncio.sleep(self.startup_poll_interval)
        self.ip = self.state_gethost()
        while self.port == 0:       # batchspawner-singleuser posts the port it listens on
            await asyncio.sleep(self.startup_poll_interval)
            if await self.query_job_status() not in (JobStatus.RUNNING, JobStatus.UNKNOWN):
                raise JobProblem(await self._ended(job))
        self.db.commit()
        self.log.info("parlab: %s's server is Slurm job %s at %s:%s", self.user.name, job,
                      self.ip, self.port)
        return self.ip, self.port

    async def _ended(self, job: str) -> str:
        """What the learner reads when job `job` will not serve them."""
        self.clear_state()
        if self._hopeless:
            return (f"Slurm cannot start your server's job {job}: it waits for "
                    f"{self._hopeless}, which no wait resolves (the job is cancelled). The "
                    "profile asks for what this cluster or your account cannot give: choose "
                    "another, or tell your instructor.")
        try:
            fields = job_fields(await self._as_learner(self.job_show_cmd, job_id=job))
        except RuntimeError as exc:
            fields = {"JobState": f"unknown ({exc})"}
        said = (f"Your server's Slurm job {job} ended before your server started: "
                f"{fields.get('JobState')}, "
                f"reason {fields.get('Reason', '?')}, exit code {fields.get('ExitCode', '?')}.")
        log = Path(fields.get("StdOut", "")) if fields.get("StdOut") else None
        try:
            tail = log.read_text(errors="replace").splitlines()[-6:] if log else []
        except OSError:
            tail = []
        if tail:
            said += f" The last lines of its log ({log}):\n" + "\n".join(tail)
        return said

    async def stop(self, now: bool = False) -> None:
        if self.job_id:            # nothing to cancel after a failed start (state cleared)
            await super().stop(now)

    async def progress(self) -> AsyncIterator[dict[str, str]]:
        """The spawn page's lines: the queue's wait and its reason, then the node."""
        while True:
            state, *rest = (self.job_status or "SUBMITTING").split(maxsplit=2)
            if self.state_isrunning():
                yield {"message": f"Slurm job {self.job_id} runs on {rest[0] if rest else '?'}:"
                                  " starting your server..."}
                return
            if self.state_ispending():
                waited = time.monotonic() - self._queued_at
                reason = rest[1] if len(rest) > 1 else "?"
                yield {"message": f"Your server is Slurm job {self.job_id}, waiting in the "
                                  f"queue for {waited:.0f} s (reason: {reason}); the hub waits "
                                  f"up to {self.start_timeout} s."}
            else:
                yield {"message": "Submitting your server's job to Slurm..."}
            await asyncio.sleep(1)
