"""A real Slurm on this machine for `make test-cluster`: munged, slurmctld and two slurmd
(node1 and node2, two `slurmd -N` on this host) from autograder/cluster/slurm.conf.in, every
file they write in one temporary folder.

    with running_cluster() as cluster:            # tests: the `slurm_cluster` fixture
        job = cluster.sbatch("--nodes=2", "job.sbatch", cwd=folder)
        cluster.wait(job)["JobState"]              # "COMPLETED"
        cluster.sbatch("job.sbatch", user="ann", cwd=anns_folder)   # as a Unix user

The daemons run in a PID and mount namespace of their own (`unshare --pid --mount-proc
--kill-child`), whose first process is `init` below: when it ends, the kernel ends every
process left in the namespace (daemons, job steps, ranks), and it ends when this process
closes its stdin, or dies. In that mount namespace /etc/hosts also names node1 and node2
(127.0.0.1), as a cluster's DNS would, so that jobs can reach a node by the name Slurm gives
it; the machine's own /etc/hosts is untouched. The client commands (sbatch, squeue, scontrol)
run outside, with SLURM_CONF pointing at the folder's slurm.conf.

Root only: slurmd starts each job as the Unix user who submitted it, munged runs as munge.
A job runs with the submitter's environment (SLURM_CONF, TMPDIR=`cluster.tmp`); another
user's job can run Python only from a venv they can read: not .venv, made from a Python under
/root (0700 here), but one made from /usr/bin/python3, as `make test-hub`'s .venv-hub.
`python tests/cluster.py shell [proctrack/pgid]` starts one and opens a shell with SLURM_CONF
set in it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "autograder" / "cluster" / "slurm.conf.in"
NODES = ("node1", "node2")
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "unshare", "runuser", "mount")


def missing() -> str | None:
    """Why no cluster can start here; None when one can."""
    if os.geteuid() != 0:
        return "it needs root (slurmd starts each job as its user, munged runs as munge)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found (Debian: apt-get install slurm-wlm munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no munge user (Debian's munge package makes it)"
    return None


def free_ports(count: int) -> list[int]:
    """`count` ports that can be bound on 127.0.0.1, below the ephemeral range (where a client
    connection could take one between this look and the daemon's bind)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 30000)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            if port not in ports:
                ports.append(port)
    return ports


@dataclass
class Cluster:
    """A running test cluster: its folder and how to run Slurm's commands against it."""

    dir: Path
    tmp: Path
    """World-writable scratch (1777) inside the folder: jobs' TMPDIR, folders for users."""

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client command; sbatch passes it on to the job."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "TMPDIR": str(self.tmp)}

    def run(self, *args: str, user: str | None = None, cwd: Path | None = None,
            check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command with this cluster's environment, as root or as `user`."""
        cmd = [*(["runuser", "-u", user, "--"] if user else []), *args]
        done = subprocess.run(cmd, env=self.env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}"
                               f"{done.stderr}")
        return done

    def sbatch(self, *args: str, user: str | None = None, cwd: Path | None = None) -> int:
        """Submit; the job id."""
        return int(self.run("sbatch", "--parsable", *args, user=user, cwd=cwd).stdout
                   .strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, ExitCode, Restarts, UserId, ...)."""
        out = self.run("scontrol", "show", "job", "--oneliner", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id: int, timeout: float = 120, states: frozenset[str] = FINISHED
             ) -> dict[str, str]:
        """Poll until the job is in one of `states` (by default: finished); its fields."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id))["JobState"] not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {fields['JobState']} after {timeout} s "
                                   f"({fields.get('Reason')})\n{self.logs()}")
            time.sleep(0.5)
        return fields

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log (for a failure's message)."""
        return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-lines:])
                         for log in sorted((self.dir / "log").glob("*")))

    def nodes(self) -> dict[str, str]:
        """Each node's state as sinfo reports it ("idle", "mix", "alloc", "down", ...)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def cancel_all(self, timeout: float = 30) -> None:
        """Cancel every job and wait until none is left, completing ones included."""
        if jobs := self._jobs():
            self.run("scancel", "--full", *jobs, check=False)
        deadline = time.monotonic() + timeout
        while self._jobs() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _jobs(self) -> list[str]:
        return self.run("squeue", "--noheader", "--format=%i", check=False).stdout.split()


def _layout(base: Path, *, proctrack: str, cpus: int, memory_mb: int, short_minutes: int
            ) -> None:
    """slurm.conf, the namespace's /etc/hosts, a munge key and the folders, owned as the
    daemons need them."""
    slurm_user = "slurm" if _user_exists("slurm") else "root"
    for sub in ("state", "run", "log", "munge", "tmp", *(f"spool/{n}" for n in NODES)):
        (base / sub).mkdir(parents=True)
    shutil.chown(base / "state", slurm_user, slurm_user)
    (base / "tmp").chmod(0o1777)
    ctld, *nodes = free_ports(1 + len(NODES))
    conf = string.Template(TEMPLATE.read_text()).substitute(
        host=socket.gethostname(), ctld_port=ctld, node1_port=nodes[0], node2_port=nodes[1],
        slurm_user=slurm_user, munge_socket=base / "munge" / "munge.socket", dir=base,
        proctrack=proctrack, cpus=cpus, memory_mb=memory_mb, short_minutes=short_minutes)
    (base / "slurm.conf").write_text(conf)
    (base / "hosts").write_text(Path("/etc/hosts").read_text() + f"127.0.0.1 {' '.join(NODES)}\n")
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for path in (base / "munge", key):
        shutil.chown(path, "munge", "munge")  # munged refuses a key another user owns


@contextlib.contextmanager
def running_cluster(*, proctrack: str = "proctrack/linuxproc", cpus: int = 4,
                    memory_mb: int = 4000, short_minutes: int = 2, start_timeout: float = 60
                    ) -> Iterator[Cluster]:
    """Start a cluster in a new temporary folder; at the end cancel every job, stop every
    daemon, check that no process of it is left and remove the folder. `proctrack`: which
    processes of a job step a signal reaches (autograder/cluster/slurm.conf.in)."""
    why = missing()
    if why:
        raise RuntimeError(f"no Slurm test cluster here: {why}")
    base = Path(tempfile.mkdtemp(prefix="parlab-slurm-"))
    base.chmod(0o755)  # users' commands reach the munge socket and slurm.conf
    cluster, init = Cluster(base, base / "tmp"), None
    try:
        _layout(base, proctrack=proctrack, cpus=cpus, memory_mb=memory_mb,
                short_minutes=short_minutes)
        with open(base / "log" / "init.log", "w") as log:  # its own session: no Ctrl-C
            init = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                 __file__, "init", str(base)], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while (nodes := cluster.nodes()) != dict.fromkeys(NODES, "idle"):
            if init.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster did not start (nodes: {nodes})\n"
                                   f"{cluster.logs()}")
            time.sleep(0.3)
        yield cluster
    finally:
        if init is not None:
            left = _stop(cluster, init)
        shutil.rmtree(base, ignore_errors=True)
    if init is not None and left:
        raise RuntimeError(f"processes of the test cluster outlived it: {left}")


def _stop(cluster: Cluster, init: subprocess.Popen[bytes]) -> list[str]:
    """Cancel the jobs, close init's stdin (it stops the daemons and ends the namespace);
    the processes still alive in the namespace afterwards (none expected)."""
    namespace = _namespace(init.pid)
    if init.poll() is None:
        cluster.cancel_all()
    with contextlib.suppress(OSError):
        assert init.stdin is not None
        init.stdin.close()
    try:
        init.wait(timeout=30)
    except subprocess.TimeoutExpired:
        init.kill()  # --kill-child: its child, the namespace's init, gets SIGKILL
        init.wait()
    return [] if namespace is None else _in_namespace(namespace)


def _namespace(unshare_pid: int) -> str | None:
    """The PID namespace of unshare's child (the daemons' namespace)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        child = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()[0]
        return os.readlink(f"/proc/{child}/ns/pid")
    return None


def _in_namespace(namespace: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and os.readlink(proc / "ns" / "pid") == namespace:
                found.append(f"{proc.name} {(proc / 'cmdline').read_bytes()[:80]!r}")
    return found


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# --- inside the namespace ---------------------------------------------------------------------
def init(base: Path) -> None:
    """PID 1 of the daemons' namespace: /etc/hosts with the nodes, munged (as munge), slurmctld,
    one slurmd per node; reap every orphan (job steps' slurmstepd end up here) until stdin
    closes, then stop the daemons. Returning ends the namespace and whatever is left in it."""
    subprocess.run(["mount", "--bind", str(base / "hosts"), "/etc/hosts"], check=True)
    conf, munge, log = str(base / "slurm.conf"), base / "munge", base / "log"
    threading.Thread(target=_reap, daemon=True).start()

    def start(name: str, *cmd: str) -> subprocess.Popen[bytes]:
        with open(log / f"{name}.out", "w") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    daemons = [start("munged", "runuser", "-u", "munge", "--", "munged", "--foreground",
                     f"--socket={munge / 'munge.socket'}", f"--key-file={munge / 'munge.key'}",
                     f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
                     f"--log-file={log / 'munged.log'}")]
    deadline = time.monotonic() + 10
    while not (munge / "munge.socket").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemons.append(start("slurmctld", "slurmctld", "-D", "-f", conf))
    daemons += [start(f"slurmd-{n}", "slurmd", "-D", "-N", n, "-f", conf) for n in NODES]
    sys.stdin.buffer.read()  # until the test session closes it, or dies
    for daemon in reversed(daemons):  # the nodes, the controller, munged
        daemon.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            daemon.wait(timeout=10)


def _reap() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.2)


def _shell(proctrack: str) -> int:
    with running_cluster(proctrack=proctrack) as cluster:
        print(f"test cluster in {cluster.dir}; SLURM_CONF is set in this shell (exit ends it)")
        return subprocess.call([os.environ.get("SHELL", "/bin/bash")], env=cluster.env)


if __name__ == "__main__":
    if sys.argv[1:2] == ["init"]:
        init(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["shell"] and len(sys.argv) <= 3:
        sys.exit(_shell(sys.argv[2] if len(sys.argv) == 3 else "proctrack/linuxproc"))
    else:
        sys.exit(f"usage: {sys.argv[0]} shell [proctrack/pgid]")
