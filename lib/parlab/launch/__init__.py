"""Run a function on several ranks, and explain every way that can fail.

    from parlab.launch import run
    run(fn, world_size=4)      # fn(...) on 4 ranks, results in rank order

- `runner`: `run` (its docstring says which backend, what is raised, how hangs end) and
  `pick_backend`.
- `rank`: the life of one rank in its child process (status line, process group, result).
- `errors`: `RankError`, `CollectiveMismatch`, `CollectiveTimeout`, each naming the rank and
  what it was doing; in a notebook they show only the learner's own frames.
- `diagnose`: the watch that turns a hang into a sentence about what each rank was doing, and
  stops the run early when the hang is certain.
"""

from parlab.launch.errors import CollectiveMismatch, CollectiveTimeout, RankError
from parlab.launch.runner import pick_backend, run

__all__ = [
    "run", "pick_backend", "RankError", "CollectiveMismatch", "CollectiveTimeout",
]
