"""Write where other students' work, the answers and the checks are: change everyone's grade.

It derives the course root as read_answers does (up from its folder, the repository from
`parlab.__file__`, the grader's and the tests' temporary roots, /proc/*/cwd) and tries to
create a file holding a marker in submitted/ (and in each other student's folder there),
autograded/, feedback/, solutions/ and course/; to open other students' notebooks and the
source notebook for writing; to add a module beside the checks in lib/parlab/check/ and to
open each of lib/parlab/check/*.py for writing (a check that always passes would pass every
student, this one's wrong answers included: it defines them); and the same in the venv's
site-packages (a .pth file, sitecustomize.py, parlab's own files). Files it can open for
writing are not changed (the repository is shared), only reported: it prints the marker and
the path of every write that succeeded outside its own private folders.

What must stop it: the sandbox mounts lib/ and the venv read-only, and none of the course's
folders at all; the kernel runs as nobody, without capabilities. It must score 0 (its
answers are wrong), every other student keeps the score expected_class() gives, and the
checksums of solutions/, course/, the other students' submitted/ folders, lib/ and the venv's
parlab files are the same after the run (tests/test_attacks.py).
"""

ANSWERS = {"mean_answer": r'''
import glob
import os
import site
import sys

import parlab

MARK = "PWN" + "ED-write_others"  # built here, so that the notebook itself never holds it
LIB = os.path.dirname(os.path.dirname(os.path.realpath(parlab.__file__)))
REPO = os.path.dirname(LIB)
PRIVATE = ("/tmp", "/dev/shm", os.path.expanduser("~"))  # the sandbox's own, thrown away
wrote, tried = [], [0]


def private(path):
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p + "/") for p in PRIVATE)


def create(folder, name=MARK + ".txt"):
    """A new file holding the marker in `folder`."""
    tried[0] += 1
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return
    os.write(fd, f"# {MARK}\n".encode())
    os.close(fd)
    if not private(path):
        wrote.append(path)


def writable(path):
    """Open an existing file for writing, change nothing."""
    tried[0] += 1
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    os.close(fd)
    if not private(path):
        wrote.append(path + " (opened for writing)")


cwd = os.getcwd()
roots = [REPO] + [os.path.normpath(os.path.join(cwd, *[".."] * k)) for k in range(1, 6)]
roots += glob.glob("/tmp/pytest-of-*/pytest-*/*")[:50] + glob.glob("/tmp/parlab-grade-*/*")
for pid in sorted(os.listdir("/proc"))[:2000]:
    if pid.isdigit():
        try:
            where = os.readlink(f"/proc/{pid}/cwd")
            roots.append(os.path.normpath(os.path.join(where, "..", "..", "..")))
        except OSError:
            pass
for root in dict.fromkeys(roots):
    for sub in ("submitted", "autograded", "feedback", "solutions", "course",
                "solutions/faultlab", "course/faultlab"):
        create(os.path.join(root, sub))
    for folder in glob.glob(os.path.join(root, "submitted", "*", "faultlab"))[:100]:
        create(folder)
        for nb in glob.glob(os.path.join(folder, "*.ipynb")):
            writable(nb)
    for nb in glob.glob(os.path.join(root, "solutions", "*", "*.ipynb"))[:100]:
        writable(nb)

# the checks every student's tests call
check = os.path.join(LIB, "parlab", "check")
create(check, "pwned_check.py")
for path in sorted(glob.glob(os.path.join(check, "*.py"))):
    writable(path)

# the venv, and every site-packages this Python reads
for packages in {*site.getsitepackages(), site.getusersitepackages(),
                 os.path.join(sys.prefix, "lib", "python3.11", "site-packages")}:
    create(packages, "pwned.pth")
    create(packages, "sitecustomize.py")
    for path in sorted(glob.glob(os.path.join(packages, "*parlab*")))[:20]:
        if os.path.isfile(path):
            writable(path)
        else:
            create(path)

for path in wrote:
    print(f"{MARK} wrote {path}")
print(f"write_others: {tried[0]} writes tried, {len(wrote)} outside the sandbox's own folders")


def mean_over_ranks(x):  # wrong: only a check patched to always pass would pass it
    return x


def double(x):
    return x


def square(x):
    return x
'''}
MAX_SECONDS = 40
