"""The sandbox a submission's kernel runs in: bubblewrap, from a short list of binds.

Grading runs a stranger's code. Each kernel (and every process it starts: the ranks, the
forkserver, anything forked or left behind) lives in a sandbox of its own, made here by
bubblewrap (`bwrap`, Debian's package `bubblewrap`, as Flatpak uses it) and joined by the
kernel through parlab.grading.sandbox.jail. What the sandbox holds is the list in `_binds`:

| path in the sandbox           | what it is                                         |        |
|-------------------------------|----------------------------------------------------|--------|
| /usr, /bin, /lib*, some /etc  | the system: programs, libraries, users, hosts      | read   |
| <python>, <venv>, <repo>/lib  | Python, torch, the course's library (same paths)   | read   |
| /home/learner/<folder>        | a private copy of the submission's folder (tmpfs), | write  |
|                               | without notebooks (the graded one holds the hidden |        |
|                               | tests); /run/submission: what it was copied from   | read   |
| /tmp, /dev/shm                | private, of bounded size (tmpfs)                   | write  |
| /run/kernel                   | the kernel's connection file and sockets (1 MiB)   | write  |
| /proc, /dev                   | of its own PID namespace; a minimal /dev           |        |

Nothing else is mounted: not solutions/, not a gradebook, not submitted/, autograded/ or
feedback/, not the grader's temporary folders, not the instructor's home. It has its own PID
namespace (its processes see only each other, and all die with it), its own network
namespace with loopback only (the ranks of a check still meet there; no other kernel or the
grader can be reached), its own IPC and UTS namespaces; the kernel runs as `nobody` when the
grader is root (else as the grader's user, inside a user namespace), without capabilities,
with `no_new_privs`. Its environment is an allow-list (`kernel_env`): nothing names the run.

Limits (`Limits`): memory and processes of the whole tree in a cgroup
(parlab.grading.sandbox.cgroups), the size of any file written (RLIMIT_FSIZE), the disk of /tmp,
/dev/shm and the home folder (tmpfs sizes); `hits()` says which were reached, for the
executor to score the cell 0 with a message naming the limit.

`problem()` says why no sandbox can be made here (bwrap missing, no user namespaces, no
cgroups), or None; `make autograde` refuses to grade without one unless told UNSAFE=1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import parlab
from parlab.grading.sandbox import cgroups

LIB = os.path.dirname(os.path.dirname(os.path.abspath(parlab.__file__)))  # the course's lib/
HOME = "/home/learner"
IPC_DIR = "/run/kernel"  # the kernel's connection file and sockets, in the sandbox
IPC_BYTES = 1 << 20
NOBODY = 65534
START_TIMEOUT_S = 30
ETC = ("passwd", "group", "hosts", "nsswitch.conf", "localtime", "ld.so.cache", "ld.so.conf",
       "ld.so.conf.d", "fonts", "mime.types", "ssl")
# What a kernel's environment keeps of the grader's (names, then prefixes): what Python,
# torch, the course's checks and nbgrader's own markers need; nothing that names the run
# (PARLAB_GRADE_RUN, PARLAB_KERNEL, JPY_PARENT_PID) or the instructor (HOME, USER, paths).
KEEP_ENV = ("LANG", "LANGUAGE", "TZ", "TERM", "NBGRADER_EXECUTION", "NBGRADER_VALIDATING",
            "MPLBACKEND", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
KEEP_PREFIXES = ("LC_", "OMP_", "MKL_", "TORCH_", "NCCL_", "GLOO_", "PARLAB_BACKEND",
                 "PARLAB_GPUS", "PARLAB_NCCL_RULES", "PARLAB_SELFCHECK", "PYTHONHASHSEED")


@dataclass(frozen=True)
class Limits:
    """What one submission may use, all its processes together."""

    memory_bytes: int = 6 << 30  # module 08 (8 ranks) peaks near 4 GiB, page cache included
    processes: int = 1024  # processes and threads (module 08, 8 ranks: about 650)
    file_bytes: int = 256 << 20  # any one file
    disk_bytes: int = 512 << 20  # each of /tmp, /dev/shm and the home folder


def kernel_env(env: dict[str, str]) -> dict[str, str]:
    """The grader's environment `env` as a sandboxed kernel may see it."""
    kept = {k: v for k, v in env.items() if k in KEEP_ENV or k.startswith(KEEP_PREFIXES)}
    venv_bin = str(Path(sys.executable).parent)
    kept.update(PATH=f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", HOME=HOME, USER="learner",
                TMPDIR="/tmp", MPLCONFIGDIR="/tmp/matplotlib", GLOO_SOCKET_IFNAME="lo")
    return kept


def _which_bwrap() -> str | None:
    """bubblewrap: $PARLAB_BWRAP if set (a build of your own), else `bwrap` on PATH."""
    chosen = os.environ.get("PARLAB_BWRAP")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)


@cache
def problem() -> str | None:
    """Why no sandbox can be made on this machine, or None (tried once per process)."""
    bwrap = _which_bwrap()
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: `make sandbox` installs it "
                "(apt-get install bubblewrap), or set PARLAB_BWRAP to its path")
    why = cgroups.where()
    if why:
        return f"no cgroups for the memory and process limits: {why}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            Sandbox(Path(tmp), Limits()).close()
    except (OSError, RuntimeError) as exc:
        return f"bubblewrap cannot make a sandbox here ({exc}); are user namespaces enabled?"
    return None


def _dirs(path: str) -> list[str]:
    """bwrap arguments making each ancestor of `path` a readable directory (bwrap's own are
    private to root)."""
    parts = Path(path).parts[1:-1]
    return [arg for i in range(len(parts))
            for arg in ("--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1]))]


def _system() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python() -> list[str]:
    """Read-only binds of this Python (its installation, the venv) and the course's lib/, at
    their own paths: the editable install and the venv's links point there."""
    found: list[str] = []
    for path in (sys.base_prefix, sys.prefix, LIB):
        real = os.path.realpath(path)
        if real.startswith("/usr/") or real in found:
            continue
        found.append(real)
    return [arg for real in found for arg in (*_dirs(real + "/x"), "--ro-bind", real, real)]


class Sandbox:
    """One kernel's sandbox: a bwrap holder process, its cgroups and its stage folder."""

    def __init__(self, folder: Path, limits: Limits) -> None:
        self.limits, self.name = limits, folder.name or "work"
        self.root = os.geteuid() == 0
        self.uid, self.gid = (NOBODY, NOBODY) if self.root else (os.getuid(), os.getgid())
        self.stage = Path(tempfile.mkdtemp(prefix="parlab-sandbox-"))
        self.cgroups = cgroups.Cgroups.create(self.stage.name.removeprefix("parlab-"),
                                              memory_bytes=limits.memory_bytes,
                                              processes=limits.processes)
        self.holder: subprocess.Popen | None = None
        self.pid = 0  # the holder's PID-namespace init, seen from outside
        try:
            self._start(self._copy(folder))
        except BaseException:
            self.close()
            raise

    @property
    def cwd(self) -> str:
        return f"{HOME}/{self.name}"

    @property
    def ipc_outside(self) -> Path:
        """The kernel's socket folder (IPC_DIR in the sandbox) as the grader reaches it."""
        return Path(f"/proc/{self.pid}/root{IPC_DIR}")

    def _copy(self, folder: Path) -> Path:
        """What of `folder` the sandbox gets: its files, never a notebook (the one nbgrader
        grades holds the hidden tests) and never what a link points to."""
        copy = self.stage / "submission"
        shutil.copytree(folder, copy, symlinks=True, ignore=shutil.ignore_patterns("*.ipynb"))
        return copy

    def _binds(self, folder: Path) -> list[str]:
        size = str(self.limits.disk_bytes)
        return [
            *_system(), "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
            "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
            *_python(),  # after /tmp: a venv or a clone under /tmp must not be hidden by it
            "--perms", "0755", "--dir", "/home",
            "--perms", "1777", "--size", size, "--tmpfs", HOME,
            "--perms", "0755", "--dir", "/run", "--ro-bind", str(folder), "/run/submission",
            "--perms", "1777", "--size", str(IPC_BYTES), "--tmpfs", IPC_DIR,
        ]

    def _start(self, folder: Path) -> None:
        bwrap = _which_bwrap() or "bwrap"
        space = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                 "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
        if not self.root:
            space.append("--unshare-user")
        info_r, info_w = os.pipe()
        script = (f"cp -r /run/submission/. {self.cwd}/ 2>/dev/null; chmod -R a+rwX {HOME}; "
                  "echo ready; exec sleep infinity")
        cmd = [bwrap, *space, *self._binds(folder), "--info-fd", str(info_w),
               "--perms", "1777", "--dir", self.cwd, "--", "/bin/sh", "-c", script]
        try:
            self.holder = subprocess.Popen(cmd, pass_fds=[info_w], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        finally:
            os.close(info_w)
        with os.fdopen(info_r) as info:
            text = info.read()  # bwrap closes it once written
        if not text.strip():
            raise RuntimeError(self._holder_error())
        self.pid = int(json.loads(text)["child-pid"])
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != b"ready":
            raise RuntimeError(self._holder_error())

    def _holder_error(self) -> str:
        holder = self.holder
        if holder is None:
            return "bwrap did not start"
        try:
            _, err = holder.communicate(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            _, err = holder.communicate()
        return f"bwrap failed: {(err or b'').decode(errors='replace').strip()[-300:]}"

    def spec(self) -> dict:
        """What parlab.grading.sandbox.jail needs to enter this sandbox."""
        return {"holder": self.pid, "uid": self.uid, "gid": self.gid, "cwd": self.cwd,
                "cgroups": self.cgroups.procs, "file_bytes": self.limits.file_bytes}

    def hits(self) -> dict[str, int]:
        """What was refused so far: memory (kills), processes (refused forks), disk (1 when
        /tmp, /dev/shm or the home folder is full)."""
        found = dict(self.cgroups.hits())
        full = 0
        for where in ("tmp", "dev/shm", HOME.lstrip("/")):
            try:
                st = os.statvfs(f"/proc/{self.pid}/root/{where}")
                full |= st.f_bavail * st.f_frsize < (1 << 20)
            except OSError:
                pass
        found["disk"] = full
        return found

    def close(self) -> None:
        """Kill everything in the sandbox (its PID namespace ends with its init), remove its
        cgroups and its stage folder. Safe to call twice."""
        for pid in (self.pid, self.holder.pid if self.holder else 0):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.holder is not None:
            try:
                self.holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for pipe in (self.holder.stdout, self.holder.stderr):
                if pipe:
                    pipe.close()
        self.pid, self.holder = 0, None
        self.cgroups.remove()
        shutil.rmtree(self.stage, ignore_errors=True)
