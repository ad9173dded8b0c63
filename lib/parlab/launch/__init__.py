"""Run a function on several ranks, and explain every way that can fail.

    from parlab.launch import run
    run(fn, world_size=4)      # fn(...) on 4 ranks, results in rank order

- `runner`: `run` (its docstring says what is raised, how hangs end).
- `devices`: the one device rule: `device()` (this rank's GPU under NCCL, else the CPU),
  `pick_backend` (PARLAB_BACKEND, PARLAB_GPUS), `uses_nccl`, `pin_numerics`.
- `nccl_rules`: with PARLAB_NCCL_RULES=1, what NCCL would refuse or deadlock on fails on gloo.
- `rank`: the life of one rank in its child process (status line, process group, result).
- `errors`: `RankError`, `CollectiveMismatch`, `CollectiveTimeout`, each naming the rank and
  what it was doing; in a notebook they show only the learner's own frames.
- `torchrun`: what a script under torchrun checks before any group starts (options that do
  not fit end every process with status 2, rank 0 saying why).
- `shutdown`: a Jupyter kernel that ran ranks stops the forkserver and the resource tracker
  when it is shut down, and exits at once, leaving nothing in /tmp.
- `diagnose`: the watch that turns a hang into a sentence about what each rank was doing, and
  stops the run early when the hang is certain.
"""

from parlab.launch.devices import device, pick_backend, synchronize, uses_nccl
from parlab.launch.errors import CollectiveMismatch, CollectiveTimeout, NcclRuleBroken, RankError
from parlab.launch.runner import run

__all__ = [
    "run", "device", "pick_backend", "uses_nccl", "synchronize", "RankError", "CollectiveMismatch",
    "CollectiveTimeout", "NcclRuleBroken",
]
