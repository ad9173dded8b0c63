"""The attack corpus: hostile submissions are graded beside honest ones, and change nothing.

autograder/attacks/ holds one entry per way a submission can attack the grader (read the
answers, forge the gradebook, write outside its sandbox, leave a process, kill, reach another
kernel; see its README.md). tests/grading_runs.py hands each in as a student `attack-<name>`
of the fault run's class, graded once through the instructor's commands with everyone else.
After that one run:

- no attacker scores more than the blank release, in the run and in the gradebook; none
  printed the marker that each attack prints for whatever it managed (read, wrote, signalled,
  reached); each finished in its bound and reached the end of its attack;
- every other student gets exactly expected_class()'s score, which does not depend on the
  attackers;
- the checksums of what no submission may change (grading_runs.outside_sandboxes), taken
  between collect and autograde, are the same after the run; no file holding the marker, or
  named with it, exists in the course root, the repository, /root, /tmp, /etc, /home;
- what an attacker's feedback shows holds no hidden-test or solution-only line (the feedback
  files of the whole class, attackers included, are generated and checked in
  test_instructor.py);
- no process is left, none of the run's and none that holds the marker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from grading_runs import (
    ATTACKS_DIR,
    BLANK,
    FAULT_MODULE,
    FAULTS_DIR,
    NO_SANDBOX,
    expected_class,
    load_attacks,
    outside_sandboxes,
)

from parlab.grading import HideHiddenTests, leftover_processes
from parlab.grading.feedback.leakcheck import file_text, find_secrets, secret_lines

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    NO_SANDBOX, reason="no sandbox on this machine (tests/grading_runs.py: NO_SANDBOX)")]

ATTACKS = load_attacks()
ATTACKERS = {a.student for a in ATTACKS}
# What the issue asks the corpus to cover, by entry name (an entry may not silently vanish).
REQUIRED = {"read_answers", "write_gradebook", "write_others", "write_instructor",
            "leave_process", "kill_grader", "reach_kernel",
            # verdicts forged in the learner's kernel (the verifier, issue 30)
            "patch_checks", "patch_launcher", "patch_ipython", "patch_builtins",
            "exfiltrate_hidden"}
# Each attack prints and writes its marker, PWNED-<name>, for whatever it managed; it is put
# together when the attack runs, so no file of the corpus or notebook holds it.
MARKERS = [b"PWN" + b"ED-" + a.name.encode() for a in ATTACKS]
SCAN_ENTRIES = 50_000  # bound on the entries each search outside the sandboxes looks at
READ_BYTES = 64 << 20  # larger files are searched by name only


def _marks(data: bytes | str) -> bool:
    """Whether `data` holds an attack's marker."""
    raw = data.encode() if isinstance(data, str) else data
    return any(marker in raw for marker in MARKERS)


def test_corpus_covers_every_required_attack() -> None:
    names = {a.name for a in ATTACKS}
    assert not REQUIRED - names, f"autograder/attacks/ lacks entries: {sorted(REQUIRED - names)}"
    for attack in ATTACKS:
        assert attack.doc and attack.answers, f"{attack.name}: needs a docstring and ANSWERS"
        text = (ATTACKS_DIR / f"{attack.name}.py").read_bytes()
        assert b"PWN" + b"ED" not in text, (
            f"{attack.name}: the entry itself holds the marker (build it when it runs), so "
            "finding it would prove nothing")
    assert len(ATTACKERS) == len(ATTACKS)


# --- scores ------------------------------------------------------------------------------------
def _printed(nb: nbformat.NotebookNode) -> str:
    return "".join(str(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_gains_nothing(fault_run, attack) -> None:
    """No more than the blank release; no marker printed (nothing it tried worked); it ran
    to the end of its attack, within its bound."""
    graded = fault_run.run.get(FAULT_MODULE, attack.student)
    blank = fault_run.run.get(FAULT_MODULE, BLANK)
    where = f"attack {attack.name} (student {attack.student})"
    assert graded.score is not None, f"{where}: not graded at all: {graded.status}"
    assert graded.score <= blank.score, (
        f"{where} scores {graded.score}, the blank release {blank.score}: {graded.cells}")
    printed = _printed(fault_run.autograded(attack.student, FAULT_MODULE))
    claims = [ln for ln in printed.splitlines() if _marks(ln)]
    assert not claims, f"{where} got through the sandbox:\n" + "\n".join(claims[:20])
    assert f"{attack.name}: " in printed, (
        f"{where} did not get to the end of its attack (no '{attack.name}: ' line); it "
        f"printed: {printed[-2000:]!r}; tests: {graded.cells}")
    assert graded.seconds is not None and graded.seconds <= attack.max_seconds, (
        f"{where}: grading took {graded.seconds} s, bound {attack.max_seconds} s")


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.disagrees],
                         ids=[a.name for a in ATTACKS if a.disagrees])
def test_forged_verdicts_show_as_disagreeing(fault_run, attack) -> None:
    """The tests an attack forged in its notebook passed there; the verifier failed them, its
    verdict is the score, and the run's record names each one as disagreeing."""
    graded = fault_run.run.get(FAULT_MODULE, attack.student)
    for gid in attack.disagrees:
        assert graded.disagreements.get(gid) == "the notebook's check passed, the verifier's " \
            "failed", (f"attack {attack.name}: {gid} should pass in its notebook and fail in the "
                       f"verifier; the record says {graded.disagreements} (cells {graded.cells})")
        assert graded.cells[gid][0] == 0, f"attack {attack.name}: {gid} scored {graded.cells[gid]}"


def test_every_other_student_keeps_the_expected_score(fault_run) -> None:
    """The honest students and the fault entries score what they score without the attackers
    (expected_class(attacks=False)), in the run and in the gradebook, where no attacker has
    more than the blank release either."""
    from nbgrader.api import Gradebook

    expected = expected_class(attacks=False)
    run = {s: fault_run.run.get(FAULT_MODULE, s).score for s in expected}
    wrong = {s: (run[s], raw) for s, (raw, _, _) in expected.items() if run[s] != raw}
    assert not wrong, f"student: (score beside the attackers, expected): {wrong}"
    with Gradebook(f"sqlite:///{fault_run.root / 'gradebook.db'}") as gb:
        book = {s.student.id: float(s.score) for s in gb.assignment_submissions(FAULT_MODULE)}
    wrong = {s: (book.get(s), raw) for s, (raw, _, _) in expected.items() if book.get(s) != raw}
    assert not wrong, f"student: (gradebook score, expected): {wrong}"
    above = {s: book.get(s) for s in ATTACKERS if book.get(s, 0.0) > book[BLANK]}
    assert not above, f"attackers above the blank release in the gradebook: {above}"


def test_honest_scores_do_not_depend_on_the_attackers() -> None:
    """The scores the class is held to are those it gets without the attack corpus (cheap:
    expected_class() is what the class scored before there was one, and tests say so)."""
    mixed, alone = expected_class(), expected_class(attacks=False)
    assert {s: v for s, v in mixed.items() if s not in ATTACKERS} == alone
    assert {mixed[s] for s in ATTACKERS} == {(0.0, 0.0, "submitted")}
    assert alone[BLANK][0] == 0.0


# --- outside the sandboxes ---------------------------------------------------------------------
def test_nothing_outside_the_sandboxes_changed(fault_run) -> None:
    before, after = fault_run.checksums, outside_sandboxes(fault_run.root)
    assert before, "no checksums were taken before autograde"
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    assert not (changed or added or removed), (
        f"changed by the run: {changed[:20]}; new: {added[:20]}; gone: {removed[:20]}")


def _entries(top: Path, depth: int, skip: tuple[str, ...] = ()) -> list[Path]:
    """Files and folders under `top`, at most `depth` levels down (bounded; no symlink
    followed; no folder named in `skip` entered)."""
    found: list[Path] = []
    todo = [(top, 0)]
    while todo and len(found) < SCAN_ENTRIES:
        folder, level = todo.pop()
        try:
            children = list(os.scandir(folder))
        except OSError:
            continue
        for entry in children:
            found.append(Path(entry.path))
            if (level + 1 < depth and entry.is_dir(follow_symlinks=False)
                    and entry.name not in skip):
                todo.append((Path(entry.path), level + 1))
    return found


def _marked(paths: list[Path], since: float, read: bool = True) -> list[str]:
    """Each path written since `since` whose name holds the marker, or (read) whose content
    does (a marker left by an earlier run is not this run's)."""
    hits = []
    for path in paths:
        try:
            st = path.lstat()
            if st.st_mtime < since:
                continue
            if _marks(path.name):
                hits.append(str(path))
            elif (read and path.is_file() and not path.is_symlink()
                  and st.st_size <= READ_BYTES and _marks(path.read_bytes())):
                hits.append(f"{path} (content)")
        except OSError:
            pass
    return hits


def test_no_marker_outside_the_sandboxes(fault_run) -> None:
    """Every file an attack writes holds the marker: none may exist where the grader, the
    instructor or another student would find it (the course root, the repository, /root,
    /tmp, /etc, /home, /), except in an attacker's own folders of the course root; written
    since the run began. Bounded searches: the course root whole; the repository's targets;
    the others a few levels down."""
    venv, python = Path(sys.prefix), Path(sys.base_prefix)
    packages = next(venv.glob("lib/python3*/site-packages"), venv)
    base_packages = next(python.glob("lib/python3*/site-packages"), python)
    searches: list[tuple[list[Path], bool]] = [
        (_entries(fault_run.root, 12), True),
        (_entries(ROOT, 1), True),
        (_entries(ROOT / "lib", 8, ("__pycache__",)), True),
        (_entries(ROOT / "solutions", 3), True),
        (_entries(ROOT / "autograder", 2, ("attacks",)), False),
        (_entries(ROOT / ".git" / "hooks", 1), True),
        (_entries(venv, 2, ("lib", "include", "share")), True),
        (_entries(packages, 1), False),
        (_entries(base_packages, 1), False),
        (_entries(Path("/root"), 3, (".pyenv", ".cache", ".npm", ".rustup", ".cargo", ".m2",
                                     ".claude")), False),
        (_entries(Path("/tmp"), 4, ("pytest-of-root",)), True),
        (_entries(Path("/tmp/pytest-of-root"), 3), False),
        (_entries(Path("/etc"), 2), False),
        (_entries(Path("/home"), 3), True),
        (_entries(Path("/"), 1), False),
        (_entries(Path("/var/tmp"), 2), True),
    ]
    own = tuple(str(fault_run.root / folder / student) for student in ATTACKERS
                for folder in ("submitted", "autograded", "feedback"))
    hits = [hit for paths, read in searches
            for hit in _marked(paths, fault_run.started - 1, read)
            if not hit.startswith(own)]  # an attacker's own (what it printed: checked above)
    assert not hits, f"files written by an attack that got out of its sandbox: {hits[:30]}"


def test_no_attacker_feedback_shows_a_secret(fault_run) -> None:
    """What each attacker's feedback page shows (its autograded notebook through the
    feedback's HideHiddenTests) holds no hidden-test line and no solution-only line it did
    not write (parlab.grading.feedback.leakcheck's rule); test_instructor.py checks the feedback
    files the instructor's `feedback` writes for the whole class."""
    source = nbformat.read(str(FAULTS_DIR / FAULT_MODULE / f"{FAULT_MODULE}.ipynb"), 4)
    release = nbformat.read(str(fault_run.root / "course" / FAULT_MODULE
                                / f"{FAULT_MODULE}.ipynb"), 4)
    leaked = {}
    for attack in ATTACKS:
        graded = fault_run.autograded(attack.student, FAULT_MODULE)
        secrets = secret_lines(graded, source, release,
                               fault_run.root / "submitted" / attack.student / FAULT_MODULE)
        shown, _ = HideHiddenTests().preprocess(nbformat.from_dict(graded), {})
        found = find_secrets(file_text("page.txt", "\n".join(_shown_text(shown))), secrets)
        if found:
            leaked[attack.name] = found[:3]
    assert not leaked, f"attackers' feedback would show: {leaked}"


def _shown_text(nb: nbformat.NotebookNode) -> list[str]:
    """What a feedback page of `nb` shows: every cell's source and every output's text."""
    texts = []
    for cell in nb.cells:
        texts.append(cell.source)
        for out in cell.get("outputs", []):
            texts += [str(out.get("text", "")), str(out.get("evalue", ""))]
            texts += [str(t) for t in out.get("traceback", [])]
            texts += [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return texts


# --- processes ---------------------------------------------------------------------------------
def test_no_process_is_left(fault_run) -> None:
    run = fault_run.run
    assert run.leftover == [] and leftover_processes(run.token) == [], (
        f"processes of the run outlived it: {run.leftover or leftover_processes(run.token)}")
    marked = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if _marks((entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()):
                    marked.append((int(entry.name), (entry / "cmdline").read_bytes()[:200]))
            except OSError:
                pass
    assert not marked, f"an attack's processes are still alive: {marked}"
