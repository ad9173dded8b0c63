"""Leave a process behind that acts once its own grading is over.

A daemon, made the classic way (fork, setsid, fork again, every descriptor closed, exec'd as
a fresh Python whose command line and environment carry a marker), waits until the kernel
that started it has gone; the answer cell then ends that kernel with os._exit, as a crash
would (grading goes on in a new kernel). For up to 60 s the daemon then writes a file holding
the marker into every folder it can write (a bounded search of / past read-only mounts) and
kills every process it can see. The notebook goes on (its answers are blank) and ends in
seconds.

What must stop it: the sandbox's PID namespace, whose every process dies with it when the
kernel ends, however it ends (bubblewrap's holder is its init; the grader closes the sandbox
and removes its stage folder); the daemon cannot leave it, nor its cgroup, by forking or
changing its session. After the run no process whose command line or environment holds the
marker may be alive, `leftover_processes` finds none, and no file outside the sandbox holds
the marker (tests/test_attacks.py): not even in the stage folder of its kernel's sockets,
the one folder of the grader's that a sandbox can write.
"""

ANSWERS = {"mean_answer": r'''
import os
import sys
import time

MARK = "PWN" + "ED-leave_process"  # built here, so that the notebook itself never holds it
DAEMON = """
import os, signal, sys, time
mark, kernel = sys.argv[1], int(sys.argv[2])
end = time.monotonic() + 60
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive(kernel) and time.monotonic() < end:
    time.sleep(0.1)
gone = time.monotonic()
private = ("/tmp", "/dev/shm", os.path.expanduser("~"))
def outside(path):
    real = os.path.realpath(path)
    return not any(real == p or real.startswith(p + "/") for p in private)
while time.monotonic() < end:
    alive_for = "%.1f" % (time.monotonic() - gone)
    wrote, budget, stack = [], 20000, ["/"]
    while stack and budget > 0:
        folder = stack.pop()
        if folder in ("/proc", "/sys"):
            continue
        try:
            if os.statvfs(folder).f_flag & os.ST_RDONLY:
                continue  # a read-only mount: nothing below it can be written
            entries = list(os.scandir(folder))
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            try:
                with open(os.path.join(folder, mark + ".txt"), "w") as f:
                    f.write(mark + " alive " + alive_for + " s after its kernel ended\\n")
                if outside(folder):
                    wrote.append(folder)
            except OSError:
                pass
        for entry in entries:
            budget -= 1
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    if wrote:
        try:
            with open(os.path.join(os.path.expanduser("~"), mark + ".log"), "a") as f:
                f.write(mark + " wrote " + " ".join(wrote) + "\\n")
        except OSError:
            pass
    time.sleep(1)
"""

kernel = os.getpid()
child = os.fork()
if child == 0:  # the first child: a session of its own, then the daemon, then gone
    try:
        os.setsid()
        if os.fork() == 0:
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 4096)
            env = {"PATH": "/usr/bin:/bin", "ATTACK": MARK, "LANG": "C.UTF-8"}
            os.execve(sys.executable, [sys.executable, "-c", DAEMON, MARK, str(kernel)], env)
    finally:
        os._exit(0)
os.waitpid(child, 0)
print(f"leave_process: a daemon started, waiting for kernel {kernel} to end")
sys.stdout.flush()
time.sleep(0.3)
os._exit(0)  # end the kernel now: grading goes on in a new one, the daemon acts
'''}
MAX_SECONDS = 75  # its notebook, then the verifier waiting out its stand-in (15 s a call)
