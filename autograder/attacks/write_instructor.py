"""Write into the instructor's account and the grader's machine: home, /etc, temp, repository.

It tries to create a file holding a marker, and to open existing files for writing, in the
places an attacker would leave something to run later as the instructor: /root ($HOME of a
grader run as root; .bashrc, .profile, .ssh/authorized_keys, .config/autostart), the
instructor's HOME if one is named, /etc (cron.d, profile.d, ld.so.preload, passwd), the
grader's temporary folders (/tmp/parlab-grade-*, /tmp/parlab-sandbox-*, including the stage
folder of its own kernel's sockets, which is the grader's), the tests' temporary roots, and
the repository root that `parlab.__file__` names (Makefile, .git/hooks, the venv's bin/ and
Python's own site-packages). Existing files are only opened, never changed. It prints the
marker and the path of each write that succeeded outside its own private folders.

What must stop it: the sandbox mounts none of these (a few /etc files and Python, read-only),
its /tmp is its own tmpfs, the kernel runs as nobody without capabilities; its stage folder
(the only folder of the grader's it can write, for the kernel's sockets) is removed when the
kernel ends. No file outside the sandbox may hold the marker after the run, in /root, /tmp,
/etc or the repository (tests/test_attacks.py).
"""

ANSWERS = {"mean_answer": r'''
import glob
import os
import sys

import parlab

MARK = "PWN" + "ED-write_instructor"  # built here, so that the notebook itself never holds it
LIB = os.path.dirname(os.path.dirname(os.path.realpath(parlab.__file__)))
REPO = os.path.dirname(LIB)
PRIVATE = ("/tmp", "/dev/shm", os.path.expanduser("~"))  # the sandbox's own, thrown away
wrote, tried = [], [0]


def private(path):
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p + "/") for p in PRIVATE)


def create(path):
    tried[0] += 1
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return
    os.write(fd, f"# {MARK}\n".encode())
    os.close(fd)
    if not private(path):
        wrote.append(path)


def writable(path):
    tried[0] += 1
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    os.close(fd)
    if not private(path):
        wrote.append(path + " (opened for writing)")


homes = {"/root", os.environ.get("HOME", "/root"), *glob.glob("/home/*")}
for home in homes:
    create(os.path.join(home, MARK + ".txt"))
    create(os.path.join(home, ".ssh", MARK + ".pub"))
    create(os.path.join(home, ".config", "autostart", MARK + ".desktop"))
    for name in (".bashrc", ".profile", ".ssh/authorized_keys", ".gitconfig"):
        writable(os.path.join(home, name))
for path in ("/etc/" + MARK, "/etc/cron.d/" + MARK, "/etc/profile.d/" + MARK + ".sh",
             "/etc/ld.so.preload", "/var/spool/cron/crontabs/root", "/" + MARK):
    create(path)
for path in ("/etc/passwd", "/etc/hosts", "/etc/ld.so.cache", "/etc/ld.so.preload"):
    writable(path)
# the grader's temporary folders, and the tests' course roots
for folder in (glob.glob("/tmp/parlab-grade-*") + glob.glob("/tmp/parlab-sandbox-*")
               + glob.glob("/tmp/parlab-sandbox-*/ipc") + glob.glob("/tmp/pytest-of-*")
               + glob.glob("/tmp/pytest-of-*/pytest-*")[:50] + ["/tmp", "/var/tmp"])[:200]:
    create(os.path.join(folder, MARK + ".txt"))
# the repository, its venv and Python itself
for path in (os.path.join(REPO, MARK + ".txt"), os.path.join(REPO, ".git", "hooks", "pre-commit"),
             os.path.join(REPO, "autograder", MARK + ".py"),
             os.path.join(sys.prefix, "bin", MARK),
             os.path.join(sys.base_prefix, "lib", "python3.11", "site-packages", MARK + ".pth")):
    create(path)
for path in (os.path.join(REPO, "Makefile"), os.path.join(REPO, "autograder", "nbgrader_config.py"),
             os.path.join(REPO, "nbgrader_config.py"), os.path.join(sys.prefix, "bin", "activate"),
             os.path.join(sys.prefix, "pyvenv.cfg"), sys.executable):
    writable(path)

for path in wrote:
    print(f"{MARK} wrote {path}")
print(f"write_instructor: {tried[0]} writes tried, {len(wrote)} outside the sandbox's own "
      "folders")
'''}
MAX_SECONDS = 40
