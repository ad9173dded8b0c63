"""Per-learner limits for a server started by a local-process spawner (the hub's trial).

    c.Spawner.cmd = [sys.executable, "-m", "parlab.hub.limits", ".venv/bin/jupyterhub-singleuser"]

JupyterHub passes the spawner's `mem_limit` and `cpu_limit` to the server as MEM_LIMIT (bytes)
and CPU_LIMIT (cores) but LocalProcessSpawner enforces neither. This wrapper applies them to
itself, then becomes the server (exec), so the kernel and every rank it forks inherit them:

- memory: RLIMIT_AS, the address space of each process (a rank is a process, so a run of 4
  ranks may use up to 4 times it). Past it an allocation fails in that process: the cell shows
  MemoryError or torch's "can't allocate memory", the kernel lives on. CUDA reserves far more
  address space than it uses, so a server given GPUs gets no RLIMIT_AS (said in its log).
- CPU: OMP_NUM_THREADS and MKL_NUM_THREADS = CPU_LIMIT (torch's intra-op threads per
  process) and a nice of 5: a courtesy to the others, not a wall.

A hard wall for the whole server (a cgroup: memory.max, cpu.max) needs a spawner that makes
one: SystemdSpawner (the hub's configuration, commented). There, a server past its memory is
killed by the kernel's OOM killer inside its own cgroup (the notebook says the kernel died, a
rank ends with a RankError "killed by signal 9"), and past its CPU it only slows down.
"""

from __future__ import annotations

import math
import os
import resource
import sys

__all__ = ["apply_limits", "main"]


def apply_limits(env: dict[str, str]) -> list[str]:
    """Apply MEM_LIMIT / CPU_LIMIT from `env` to this process (and `env`); what was done."""
    done = []
    mem = int(float(env.get("MEM_LIMIT", "0") or 0))
    if mem > 0 and not env.get("PARLAB_GPUS", "").strip():
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        done.append(f"address space {mem / 2**30:.1f} GiB per process")
    elif mem > 0:
        done.append("no address-space limit (a GPU server: CUDA reserves more than it uses)")
    cpus = float(env.get("CPU_LIMIT", "0") or 0)
    if cpus > 0:
        threads = str(max(1, math.ceil(cpus)))
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
        os.nice(5)
        done.append(f"{threads} threads per process, nice 5")
    return done


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m parlab.hub.limits COMMAND [ARGS...]")
    env = dict(os.environ)
    done = apply_limits(env)
    if done:
        print("parlab.hub.limits: " + "; ".join(done), file=sys.stderr, flush=True)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
