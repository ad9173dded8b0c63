"""The course on a shared GPU box through JupyterHub (`make hub`,
autograder/hub/jupyterhub_config.py).

- `allot`: the GPU allotment, a disjoint set of GPUs per learner's server from the
  instructor's plan, kept in a locked JSON file (`Plan`, `Allotment`).
- `hooks`: the spawner's pre-spawn and post-stop hooks (workspace, Jupyter configuration,
  PARLAB_GPUS, GPUs back to the pool); nothing here imports JupyterHub.
- `workspace`: a learner's workspace made as `make lab` makes it.
- `limits`: memory and CPU limits for servers of a local-process spawner.
- `notice`: the line a learner reads when their server got CPU ranks.
- `exchange`: nbgrader's exchange made private (system users only).
- `private`: what the instructor's course root keeps from learners, out of their reach.
- `slurm`: learners' servers as Slurm jobs (PARLAB_HUB_SPAWNER=slurm; imports batchspawner).
- `proxy`: the hub's proxy (configurable-http-proxy's Python port), streaming responses.
- `python -m parlab.hub gpus | free | watch`: who holds which GPUs; the gpu-pool service.
"""

from parlab.hub.allot import Allotment, AllotmentFull, Plan
from parlab.hub.hooks import HubSettings, gpu_environment, make_hooks

__all__ = ["Allotment", "AllotmentFull", "Plan", "HubSettings", "make_hooks", "gpu_environment"]
