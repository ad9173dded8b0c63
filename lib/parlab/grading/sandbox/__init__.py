"""parlab.grading.sandbox: where a submission's code runs while it is graded.

- bwrap: the sandbox itself, a bubblewrap process holding its namespaces, built from a short
  list of binds (`Sandbox`, `Limits`, `kernel_env`, `problem`, `IPC_DIR`);
- jail: how a kernel enters it (setns, then fork, then no privileges), imported by nothing
  of parlab: the warm template loads it by path, a cold kernel runs it as a script;
- cgroups: the memory, process and CPU limits of one sandbox's whole tree.

parlab.grading.autograde.kernels starts kernels in it; parlab.grading.autograde.limits sets its
limits from nbgrader's configuration; autograder/README.md ("The threat model") says what it stops.

May import: nothing else of parlab.grading (the jail runs before anything of the grader
is importable in the sandbox).
"""

from parlab.grading.sandbox.bwrap import IPC_DIR, Limits, Sandbox, kernel_env, problem

__all__ = ["IPC_DIR", "Limits", "Sandbox", "kernel_env", "problem"]
