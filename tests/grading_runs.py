"""The two autograde runs that several test files share (built once per session, conftest.py).

course run: every module of solutions/ plus the smoke fixture (tests/fixtures/), released
    with the gradebook on in a temporary course root, submitted by "alice" (the release with
    every answer filled in from the solutions) and "bob" (the blank release, up to its last
    graded cell: what the grader runs of it), and autograded by
    `parlab.grading.autograde_parallel` with the course's own limits, every cell run (not
    only those up to the last graded one, as the grader does). Each module's answered and
    blank notebooks run exactly once per session; test_notebooks.py and test_roundtrip.py
    read their verdicts from this run.
fault run: the class of issue 15's "Why", on the faultlab module, through the README's
    commands alone (`python -m parlab.grading ...`, what the make targets call): the module
    released, a due date set with nbgrader's own command, then handed in by the fake class
    (`fake`: alice full, bob blank, carol half right, as <student>/faultlab.ipynb), one
    student per fault corpus entry (deadlock, os._exit, endless loop, deleted and edited test
    cells, not JSON, ...; as <student>/faultlab/faultlab.ipynb, alice's notebook broken as
    the entry says), a renamed file, a non-ASCII name, a notebook saved with outputs, and a
    late one (its time in a CSV); `collect --times`, then `autograde --workers 3` with short
    limits and a late penalty set by the "instructor" (FAULT_ARGS). expected_class() is what
    each must score. test_faults.py, test_instructor.py and test_class.py share the run.
    The same class holds the attack corpus (autograder/attacks/): one student per entry,
    `attack-<name>`, the blank release with the entry's answer cells, which attack the grader
    (read the answers, forge the gradebook, write outside, kill, leave a process, reach
    another kernel); `outside_sandboxes` records, between collect and autograde, the
    checksums of what they must not change, and test_attacks.py checks them after the run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from parlab.grading import (
    SOLUTIONS_DIR,
    GradeRun,
    autograde_parallel,
    fake_submission,
    generate_release,
    grade_id,
    list_modules,
)
from parlab.grading.base.cells import after_last_graded
from parlab.grading.sandbox import problem as sandbox_problem
from parlab.launch.scratch import scratch_root

TESTS_DIR = Path(__file__).resolve().parent
FIXTURES_DIR = TESTS_DIR / "fixtures"
FAULTS_DIR = TESTS_DIR.parent / "autograder" / "faults"
ATTACKS_DIR = TESTS_DIR.parent / "autograder" / "attacks"
FAULT_MODULE = "faultlab"
# Both runs grade in sandboxes, as `make autograde` does. A machine that cannot make one (not
# root, no cgroups: parlab.grading.sandbox.problem) grades them without, as UNSAFE=1 would,
# and skips the tests of the sandbox itself (test_sandbox.py, test_attacks.py); CI, as root
# with bubblewrap from `make sandbox`, never does.
NO_SANDBOX = sandbox_problem() is not None and not os.environ.get("CI")
FULL, BLANK = "alice", "bob"
WORKERS = 3
# The instructor's limits for the fault run: a cell may run 15 s, a notebook 120 s, a
# submission 3 GiB of memory and 256 processes.
CELL_TIMEOUT_S, SUBMISSION_TIMEOUT_S = 15, 120
FAULT_ARGS = (f"--Execute.timeout={CELL_TIMEOUT_S}",
              f"--ResilientExecute.submission_timeout={SUBMISSION_TIMEOUT_S}",
              # ... and a late penalty (autograder/README.md, "Due dates and late work")
              "--AssignLatePenalties.plugin_class=parlab.grading.autograde.late.PenaltyPerDay",
              "--PenaltyPerDay.share_per_day=0.1",
              # ... and limits that fit faultlab (3 ranks at most), so that the entries that
              # exhaust memory and processes reach them in seconds on 2 cores
              "--ResilientExecute.memory_limit=3221225472", "--ResilientExecute.process_limit=256")


@dataclass
class CourseRun:
    root: Path
    sources: dict[str, Path]  # module -> its source folder (solutions/, fixtures/, faults/)
    run: GradeRun
    students: dict[str, list[str]] = field(default_factory=dict)  # module -> who submitted
    steps: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)  # CLI calls
    # path -> checksum of what no submission may change, taken before autograde
    # (outside_sandboxes), and when the run began (time.time()); the fault run only
    checksums: dict[str, str] = field(default_factory=dict)
    started: float = 0.0
    left_in_tmp: list[str] = field(default_factory=list)  # what the run left in /tmp

    def autograded(self, student: str, module: str) -> nbformat.NotebookNode:
        path = self.root / "autograded" / student / module / f"{module}.ipynb"
        return nbformat.read(str(path), as_version=4)


def _released(root: Path, sources: dict[str, Path]) -> None:
    """Copy each module's source into root/solutions/ and release all, gradebook on."""
    for module, src in sources.items():
        shutil.copytree(src, root / "solutions" / module,
                        ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"))
    generate_release("*", root=root, database=True)


def _submit(root: Path, student: str, module: str, notebook: nbformat.NotebookNode | str) -> None:
    folder = root / "submitted" / student / module
    shutil.copytree(root / "course" / module, folder)
    path = folder / f"{module}.ipynb"
    if isinstance(notebook, str):
        path.write_text(notebook)
    else:
        nbformat.write(notebook, str(path))


def full_answers(root: Path, module: str) -> nbformat.NotebookNode:
    name = f"{module}.ipynb"
    return fake_submission(root / "solutions" / module / name, root / "course" / module / name)


def blank_as_graded(root: Path, module: str) -> nbformat.NotebookNode:
    """The blank release as the grader runs it: the cells after the last graded one left out,
    since the grader's default (ResilientExecute.skip_after_last_test) never runs them."""
    nb = nbformat.read(str(root / "course" / module / f"{module}.ipynb"), as_version=4)
    nb.cells = nb.cells[:after_last_graded(nb.cells)]
    return nb


def in_tmp() -> set[str]:
    """The course's folders in /tmp: parlab-* and the scratch folders of processes that have
    ended (parlab.launch.scratch; this process's own live on until it exits)."""
    tmp = Path(tempfile.gettempdir())
    found = {str(p) for p in tmp.glob("parlab-*") if p != scratch_root()}
    return found | {str(p) for p in scratch_root().iterdir()
                    if not p.name.startswith(f"{os.getpid()}-")}


def course_run(root: Path) -> CourseRun:
    before = in_tmp()
    sources = {m: SOLUTIONS_DIR / m for m in list_modules(SOLUTIONS_DIR)}
    sources.update({m: FIXTURES_DIR / m for m in list_modules(FIXTURES_DIR)})
    _released(root, sources)
    for module in sources:
        _submit(root, FULL, module, full_answers(root, module))
        _submit(root, BLANK, module, blank_as_graded(root, module))
    # Every cell runs, those after the last graded one included (the grader skips them: they
    # cannot change a score): test_notebooks.py checks from this run that each of the
    # solutions executes clean; bob's notebooks end at their last graded cell.
    run = autograde_parallel(root, "*", workers=WORKERS, record=False, unsafe=NO_SANDBOX,
                             nbgrader_args=("--ResilientExecute.skip_after_last_test=False",))
    return CourseRun(root, sources, run, {m: [FULL, BLANK] for m in sources},
                     left_in_tmp=sorted(in_tmp() - before))


# --- the fault corpus -------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """One corpus entry, autograder/faults/<name>.py (see autograder/README.md)."""

    name: str
    doc: str
    answers: dict[str, str]  # answer cell grade_id -> the learner's code
    edit_tests: dict[str, str]  # locked test cell grade_id -> what the learner put there
    delete: list[str]  # grade_ids of cells the learner deleted
    raw: object  # None, or a function from the notebook's JSON text to what was submitted
    expect: dict[str, tuple[str, str]]  # test grade_id -> (ename, text in its message)
    note: dict[str, str]  # test grade_id -> text of a note printed in that cell
    max_seconds: float

    @property
    def student(self) -> str:
        return f"fault-{self.name.replace('_', '-')}"


def _entries(folder: Path, kind: str) -> list[tuple[Path, object]]:
    """Each corpus entry <folder>/<name>.py, loaded as a module, by name."""
    loaded = []
    for path in sorted(folder.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"{kind}_{path.stem}", path)
        entry = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(entry)
        loaded.append((path, entry))
    return loaded


def load_faults(folder: Path = FAULTS_DIR) -> list[Fault]:
    faults = []
    for path, entry in _entries(folder, "fault"):
        faults.append(Fault(
            path.stem, (entry.__doc__ or "").strip(), getattr(entry, "ANSWERS", {}),
            getattr(entry, "EDIT_TESTS", {}), list(getattr(entry, "DELETE", [])),
            getattr(entry, "RAW", None), entry.EXPECT, getattr(entry, "NOTE", {}),
            float(entry.MAX_SECONDS)))
    return faults


def broken(fault: Fault, full: nbformat.NotebookNode) -> str:
    """alice's full-marks notebook, broken the way `fault` says; the text submitted."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(full), as_version=4))
    ids = {grade_id(c) for c in nb.cells}
    missing = (set(fault.answers) | set(fault.edit_tests) | set(fault.delete)) - ids
    if missing:
        raise ValueError(f"fault {fault.name}: no cell {sorted(missing)} in {FAULT_MODULE}")
    for cell in nb.cells:
        gid = grade_id(cell)
        cell.source = fault.answers.get(gid, fault.edit_tests.get(gid, cell.source))
    nb.cells = [c for c in nb.cells if grade_id(c) not in fault.delete]
    text = nbformat.writes(nb)
    return fault.raw(text) if fault.raw else text


# --- the attack corpus ------------------------------------------------------------------------
@dataclass(frozen=True)
class Attack:
    """One attack entry, autograder/attacks/<name>.py (see its README.md)."""

    name: str
    doc: str
    answers: dict[str, str]  # answer cell grade_id -> the attacker's code
    max_seconds: float
    disagrees: tuple[str, ...] = ()  # tests it forges in its notebook: the verifier fails them

    @property
    def student(self) -> str:
        return f"attack-{self.name.replace('_', '-')}"


def load_attacks(folder: Path = ATTACKS_DIR) -> list[Attack]:
    return [Attack(path.stem, (entry.__doc__ or "").strip(), dict(entry.ANSWERS),
                   float(entry.MAX_SECONDS), tuple(getattr(entry, "DISAGREES", ())))
            for path, entry in _entries(folder, "attack")]


def attacking(attack: Attack, blank: nbformat.NotebookNode) -> str:
    """The blank release with the attack's answer cells: only an attack that worked could
    give it a point (its answers are blank or wrong); the text submitted."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(blank), as_version=4))
    missing = set(attack.answers) - {grade_id(c) for c in nb.cells}
    if missing:
        raise ValueError(f"attack {attack.name}: no cell {sorted(missing)} in {FAULT_MODULE}")
    for cell in nb.cells:
        cell.source = attack.answers.get(grade_id(cell), cell.source)
    return nbformat.writes(nb)


def outside_sandboxes(root: Path) -> dict[str, str]:
    """Checksums of what no submission may change (the attack corpus tries): the course
    root's solutions/ and course/ and every honest student's submitted/ folder; the
    repository's solutions/, the checks (lib/parlab/check/) and git hooks; the venv's bin/
    and its site-packages' start-up files (*.pth, sitecustomize) and parlab's own entries.
    path -> sha256 of the file (or "dir" for a folder, so that a new file shows as well)."""
    repo = TESTS_DIR.parent
    packages = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                    "site-packages")
    attackers = {a.student for a in load_attacks()}
    trees = [root / "solutions", root / "course", repo / "solutions",
             repo / "lib" / "parlab" / "check", repo / ".git" / "hooks"]
    trees += [p for p in sorted((root / "submitted").glob("*")) if p.name not in attackers]
    files = [p for tree in trees if tree.is_dir() for p in tree.rglob("*")
             if "__pycache__" not in p.parts]
    files += [*Path(sys.prefix, "bin").glob("*"), Path(sys.prefix, "pyvenv.cfg")]
    files += [p for p in packages.glob("*") if p.suffix == ".pth" or "parlab" in p.name
              or p.name.startswith(("sitecustomize", "usercustomize"))]
    sums = {}
    for path in files:
        if path.is_dir():
            sums[str(path)] = "dir"
        elif path.is_file():
            sums[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return sums


def instructor(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m parlab.grading --root ROOT ARGS`, what the make targets call."""
    return subprocess.run([sys.executable, "-m", "parlab.grading", "--root", str(root),
                           *args], capture_output=True, text=True, cwd=TESTS_DIR.parent,
                          timeout=1200)


# --- the class of the "Why": the fake class, the fault corpus, and a few more -------
CAROL = "carol"  # `fake`'s third student: the first exercise (mean_test, 2 points) left blank
RENAMED, NON_ASCII, OUTPUTS, LATE = "dana", "Zoë Müller", "erin", "frank"
NON_ASCII_ID = "Zoë_Müller"  # the student id collect makes of that folder name
NAME_TIME = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)  # in Zoë's file name
DUE = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=7)
LATE_BY = dt.timedelta(hours=36)  # two started days: 20 % of the score with 0.1 per day
SHARE_PER_DAY = 0.1
POINTS = {"mean_test": 2.0, "double_test": 1.0, "square_test": 1.0}


def _with_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as saved after running it: outputs, counts, a stale error in a test."""
    nb = nbformat.from_dict(nbformat.reads(nbformat.writes(nb), as_version=4))
    for count, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stale output\n")]
        if grade_id(cell) == "double_test":
            cell.outputs.append(nbformat.v4.new_output(
                "error", ename="AssertionError", evalue="stale", traceback=["stale"]))
    return nb


def expected_class(attacks: bool = True) -> dict[str, tuple[float, float, str]]:
    """student id -> (raw score, late penalty, grades.csv status) the class must get; with
    `attacks`, the attack corpus's students too, who score 0 (as the blank release), and no
    other student's score depends on them."""
    expect = {FULL: (4.0, 0.0, "submitted"), BLANK: (0.0, 0.0, "submitted"),
              CAROL: (2.0, 0.0, "submitted"), RENAMED: (4.0, 0.0, "submitted"),
              NON_ASCII_ID: (4.0, 0.0, "submitted"), OUTPUTS: (4.0, 0.0, "submitted"),
              LATE: (4.0, 4.0 * SHARE_PER_DAY * 2, "submitted")}
    for fault in load_faults():
        raw = 4.0 - sum(POINTS[gid] for gid in fault.expect)
        expect[fault.student] = (raw, 0.0, "could not be read" if fault.raw else "submitted")
    for attack in load_attacks() if attacks else []:
        expect[attack.student] = (0.0, 0.0, "submitted")
    return expect


def _inbox(root: Path, inbox: Path) -> None:
    """The class's hand-ins: `fake` (alice, bob, carol), each fault, each attack, and the
    others."""
    name = f"{FAULT_MODULE}.ipynb"
    full = full_answers(root, FAULT_MODULE)
    blank = nbformat.read(str(root / "course" / FAULT_MODULE / name), as_version=4)
    assert instructor(root, "fake", str(inbox)).returncode == 0
    handed_in = {inbox / fault.student / FAULT_MODULE / name: broken(fault, full)
                 for fault in load_faults()}
    handed_in.update({inbox / attack.student / FAULT_MODULE / name: attacking(attack, blank)
                      for attack in load_attacks()})
    handed_in[inbox / RENAMED / f"{FAULT_MODULE} (1).ipynb"] = nbformat.writes(full)
    handed_in[inbox / NON_ASCII / f"Meine Lösung {NAME_TIME:%Y-%m-%dT%H-%M-%S}.ipynb"] = \
        nbformat.writes(full)
    handed_in[inbox / OUTPUTS / name] = nbformat.writes(_with_outputs(full))
    handed_in[inbox / LATE / name] = nbformat.writes(full)
    for path, text in handed_in.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (inbox.parent / "times.csv").write_text(
        f"student,assignment,submitted\n{LATE},{FAULT_MODULE},{(DUE + LATE_BY).isoformat()}\n")


def set_due_date(root: Path) -> subprocess.CompletedProcess:
    """The README's command for a due date: `nbgrader db assignment add` from the repo root."""
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", "db", "assignment", "add", FAULT_MODULE,
         f"--duedate={DUE:%Y-%m-%d %H:%M:%S} UTC", f"--CourseDirectory.root={root}"],
        capture_output=True, text=True, cwd=TESTS_DIR.parent, timeout=300,
        env=dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                    os.environ.get("PATH", "")])))


def fault_run(root: Path, inbox: Path) -> CourseRun:
    started = time.time()
    shutil.copytree(FAULTS_DIR / FAULT_MODULE, root / "solutions" / FAULT_MODULE)
    generate_release(FAULT_MODULE, root=root)  # what `make release` does (no gradebook)
    _inbox(root, inbox)
    steps = {"duedate": set_due_date(root),
             "collect": instructor(root, "collect", str(inbox), "--times",
                                   str(inbox.parent / "times.csv"))}
    checksums = outside_sandboxes(root)  # what the attacks must leave as it is
    steps["autograde"] = instructor(root, "autograde", "--workers", str(WORKERS),
                                    *(["--unsafe"] if NO_SANDBOX else []), "--", *FAULT_ARGS)
    for step, proc in steps.items():
        assert proc.returncode == 0 or step == "autograde", (
            f"{step}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return CourseRun(root, {FAULT_MODULE: FAULTS_DIR / FAULT_MODULE}, GradeRun.load(root),
                     {FAULT_MODULE: sorted(expected_class())}, steps, checksums, started)
