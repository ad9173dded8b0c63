"""Enter a submission's sandbox: join its namespaces, drop every privilege, then run there.

The sandbox itself is made by bubblewrap (parlab.grading.sandbox): a process that holds a
mount, PID, network, IPC and UTS namespace of its own, with only the binds it lists. A kernel
joins it rather than being started by it, so that a kernel forked from the warm template
(parlab.grading.autograde.zygote, which has imported torch) can live in a fresh sandbox too:

1. join the sandbox's cgroups (memory and processes of the whole tree are counted there);
2. `setns` into the holder's namespaces (its user namespace first, when the grader is not
   root and bubblewrap made one);
3. fork: only a child enters the PID namespace, and everything it starts stays in it, so
   all of it dies with the holder;
4. in the child: a clean group list, the sandbox's uid and gid (nobody, when the grader is
   root), no capabilities, `no_new_privs`, the file-size limit; then the caller goes on.

This file imports nothing of parlab: the template loads it by path, and it also runs as a
script for a kernel started the plain way (a cold kernel):

    python jail.py SPEC_JSON -- python -m ipykernel_launcher -f ...

where it forwards the signals it gets (an interrupt is SIGINT) to the kernel and exits with
the kernel's status. Linux only.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

# the namespaces the holder made, joined in this order (user first: it grants the rest)
NAMESPACES = ("user", "ipc", "uts", "net", "pid", "mnt")
PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _join_namespaces(holder: int) -> None:
    libc = _libc()
    own = os.stat("/proc/self/ns/user").st_ino
    for name in NAMESPACES:
        path = f"/proc/{holder}/ns/{name}"
        if name == "user" and os.stat(path).st_ino == own:
            continue  # the grader is root: the holder shares our user namespace
        fd = os.open(path, os.O_RDONLY)
        try:
            _check(libc.setns(fd, 0), f"setns({name})")
        finally:
            os.close(fd)


def _drop_privileges(uid: int, gid: int, file_bytes: int) -> None:
    """Become `uid`/`gid` with no capabilities and no way to gain any; bound file sizes."""
    libc = _libc()
    if os.getuid() != uid or os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    if file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))


def enter(spec: dict) -> int:
    """Join the sandbox `spec` describes; fork. Returns the child's pid in the parent (which
    stays outside the PID namespace) and 0 in the child, which runs as the sandbox's user
    in `spec["cwd"]`.

    spec: holder (pid of the sandbox's holder), uid, gid, cwd (inside the sandbox),
    cgroups (cgroup.procs files to join), file_bytes (RLIMIT_FSIZE, 0: none), env (the
    child's whole environment; optional).
    """
    for procs in spec.get("cgroups", []):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    _join_namespaces(int(spec["holder"]))
    pid = os.fork()
    if pid:
        return pid
    _drop_privileges(int(spec["uid"]), int(spec["gid"]), int(spec.get("file_bytes", 0)))
    os.setsid()  # its own session: signals to the grader's process group never reach it
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nothing it prints reaches the grader's log: what the kernel
        os.dup2(null, fd)  # prints goes to the notebook, through its own sockets
    os.close(null)
    os.chdir(spec["cwd"])
    if "env" in spec:
        os.environ.clear()
        os.environ.update(spec["env"])
    return 0


def _main(argv: list[str]) -> int:
    """`jail.py SPEC -- CMD...`: run CMD in the sandbox; its exit status (see the module doc)."""
    spec, cmd = json.loads(argv[0]), argv[argv.index("--") + 1:]
    child = enter(spec)
    if child == 0:
        os.execvp(cmd[0], cmd)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, lambda s, _f: os.kill(child, s))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
