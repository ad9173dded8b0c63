"""The hub's spawn hooks: a learner's workspace, Jupyter configuration and GPUs.

    settings = HubSettings(course_root=ROOT, workspaces=str(RUN / "users/{user}"), ...)
    c.Spawner.pre_spawn_hook, c.Spawner.post_stop_hook = make_hooks(settings)

Before a server starts (`pre_spawn`): a learner's workspace is made as `make lab` makes it
(`parlab.hub.workspace`), the server opens on it with the learner's Jupyter configuration
(autograder/jupyter/learner/: Validate, no instructor panels); an instructor's opens on the
course root (`instructor_root`: PARLAB_COURSE_ROOT in the hub's configuration, else the
repository) with the instructor's configuration (formgrader), as `make formgrader` does. The
course root follows on JUPYTER_CONFIG_PATH: nbgrader (Validate, formgrader) reads its
nbgrader_config.py from there, as it reads it from the working directory under `make lab`. The
server takes GPUs from the allotment (`parlab.hub.allot`) and gets them as PARLAB_GPUS; with
none left it gets CPU ranks over gloo and the line of `parlab.hub.notice`, or waits (the
plan's when_full). When it stops, or is culled idle (`post_stop`), its GPUs go back. Under
Slurm (`scheduler_gpus`) a server gets no GPU setting at all: its job's ranks use the GPUs
Slurm granted it (CUDA_VISIBLE_DEVICES), none on a CPU profile.
With `exchange` (the system's users only: nbgrader names a student by their Unix account) a
learner's workspace starts empty and modules arrive through nbgrader's exchange, from the
Assignments tab of the hub's learner configuration (autograder/hub/jupyter/learner/); every
server reads autograder/hub/nbgrader/nbgrader_config.py (`parlab.hub.exchange`), and a
learner's JupyterLab gets the lab extension of autograder/hub/jupyter/labextensions/ (the
Assignment List open on arrival, "view feedback" opening the page). An instructor's server also
reads autograder/hub/jupyter/instructor/ (the status page, `parlab.grading.report.status_page`).
The hooks read only what every JupyterHub spawner has (user.name, name, environment,
notebook_dir, log): nothing here imports JupyterHub.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.hub.allot import Allotment
from parlab.hub.workspace import make_workspace

__all__ = ["HubSettings", "make_hooks", "gpu_environment", "server_key"]


@dataclass
class HubSettings:
    """What the hooks need from the hub's configuration (autograder/hub/jupyterhub_config.py)."""

    course_root: Path                      # the repository: course/, nbgrader_config.py
    workspaces: str                        # a learner's workspace, "{user}" filled in
    instructor_root: Path | None = None    # where instructors grade (None: course_root)
    instructors: frozenset[str] = frozenset()
    allotment: Allotment | None = None     # None: no GPUs on this box
    wait_s: float = 600.0                  # under when_full="wait", how long a spawn waits
    system_users: bool = False             # workspaces owned by the system user of that name
    exchange: Path | None = None           # nbgrader's exchange root (system users only)
    course_id: str = "parlab"              # the course's name in the exchange
    extra_env: dict[str, str] = field(default_factory=dict)
    scheduler_gpus: bool = False           # Slurm grants the GPUs (CUDA_VISIBLE_DEVICES)

    def __post_init__(self) -> None:
        if self.exchange is not None and not self.system_users:
            raise ValueError("nbgrader's exchange needs the system's users "
                             "(PARLAB_HUB_SYSTEM_USERS=1): it names the student by the Unix "
                             "account, and the trial runs every learner as one")

    @property
    def learner_jupyter(self) -> Path:
        return self.course_root / "autograder" / "jupyter" / "learner"

    @property
    def instructor_jupyter(self) -> Path:
        return self.course_root / "autograder" / "jupyter" / "instructor"

    def config_path(self, instructor: bool) -> str:
        """A server's JUPYTER_CONFIG_PATH: its Jupyter configuration, the exchange's nbgrader
        configuration (with an exchange), the course root (its nbgrader_config.py)."""
        hub = self.course_root / "autograder" / "hub"
        if instructor:       # + the status page (parlab.grading.report.status_page)
            paths = [self.instructor_jupyter, hub / "jupyter" / "instructor"]
        else:
            paths = [hub / "jupyter" / "learner" if self.exchange else self.learner_jupyter]
        if self.exchange is not None:
            paths.append(hub / "nbgrader")
        return ":".join(map(str, [*paths, self.course_root]))


def server_key(spawner: Any) -> str:
    """Who holds GPUs: the user's name, with the server's name for a named server."""
    name = getattr(spawner, "name", "") or ""
    return spawner.user.name + (f"/{name}" if name else "")


def gpu_environment(gpus: list[int], *, planned: int) -> dict[str, str]:
    """The environment that gives a server `gpus` ([]: CPU ranks, the fallback line when the
    plan has GPUs at all). GPU numbers are the box's (nvidia-smi's order)."""
    if gpus:
        return {"PARLAB_GPUS": ",".join(map(str, gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "PARLAB_HUB_FALLBACK": ""}
    env = {"PARLAB_GPUS": "", "CUDA_VISIBLE_DEVICES": "", "PARLAB_BACKEND": "gloo"}
    if planned:
        env["PARLAB_HUB_FALLBACK"] = (f"all {planned} GPUs of this box are held by other "
                                      "learners' servers")
    return env


def _prepare(settings: HubSettings, spawner: Any) -> None:
    """Workspace, Jupyter configuration, course root: everything but the GPUs."""
    user = spawner.user.name
    env = dict(spawner.environment)
    env.update(settings.extra_env)
    if settings.exchange is not None:
        env["PARLAB_HUB_EXCHANGE"] = str(settings.exchange)
        env["PARLAB_HUB_COURSE_ID"] = settings.course_id
    instructor = user in settings.instructors
    env["JUPYTER_CONFIG_PATH"] = settings.config_path(instructor)
    if instructor:
        root = settings.instructor_root or settings.course_root
        env["PARLAB_COURSE_ROOT"] = str(root)
    else:
        root = expand(settings.workspaces, user)
        new = make_workspace(settings.course_root / "course", root,
                             owner=user if settings.system_users else None,
                             copy=settings.exchange is None)
        env["PARLAB_HUB_WORKSPACE"] = str(root)   # where Fetch puts a module (the exchange)
        if settings.exchange is not None:   # the learner's lab extension: Assignment List
            env["JUPYTER_PATH"] = ":".join(filter(None, [
                str(settings.course_root / "autograder" / "hub" / "jupyter"),
                env.get("JUPYTER_PATH")]))
        if new:
            spawner.log.info("parlab: new in %s's workspace %s: %s", user, root, ", ".join(new))
    spawner.environment = env
    spawner.notebook_dir = str(root)


def _give_gpus(settings: HubSettings, spawner: Any, gpus: list[int]) -> None:
    planned = len(settings.allotment.plan.gpus) if settings.allotment else 0
    spawner.environment = {**spawner.environment, **gpu_environment(gpus, planned=planned)}
    spawner.log.info("parlab: %s gets %s", server_key(spawner),
                     f"GPUs {gpus}" if gpus else "CPU ranks over gloo")


def make_hooks(settings: HubSettings) -> tuple[Callable[[Any], Any], Callable[[Any], None]]:
    """(pre_spawn_hook, post_stop_hook) for c.Spawner."""

    def pre_spawn(spawner: Any) -> Coroutine[Any, Any, None] | None:
        _prepare(settings, spawner)
        pool = settings.allotment
        if settings.scheduler_gpus:     # the job's GPUs are what Slurm grants: no PARLAB_GPUS
            return None
        if pool is None:
            _give_gpus(settings, spawner, [])
            return None
        if pool.plan.when_full == "cpu":
            _give_gpus(settings, spawner, pool.take(server_key(spawner)))
            return None

        async def waiting() -> None:  # the hub awaits it; its event loop keeps serving
            key = server_key(spawner)
            gpus = await asyncio.to_thread(pool.take, key, wait_s=settings.wait_s)
            _give_gpus(settings, spawner, gpus)
        return waiting()

    def post_stop(spawner: Any) -> None:
        if settings.allotment is not None:
            back = settings.allotment.give_back(server_key(spawner))
            if back:
                spawner.log.info("parlab: %s gave back GPUs %s", server_key(spawner), back)

    return pre_spawn, post_stop


def expand(template: str, user: str) -> Path:
    """A workspace template for one user (~ expanded)."""
    return Path(os.path.expanduser(template.format(user=user)))
