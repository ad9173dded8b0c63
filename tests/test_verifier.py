"""The verifier (parlab.grading.verify, issue 30): verdicts decided in a process that never
ran learner code, from plain data, against references it made itself.

- the wire refuses anything but plain data, both ways; a view keeps its storage's size, and
  what a call changed in place comes back;
- what of a notebook runs where: a bare call in an answer cell (the place a patch goes) is
  not part of the learner's source, and the released source holds no answer;
- every module the verifier grades (`verify_only` in autograder/nbgrader_config.py: all), on
  the solutions, the blank release, the half-done fake student and every entry of
  autograder/mistakes/: the verifier's verdict per test equals the notebook's (its test cells
  run here, on the same answers, as the kernel would run them); in `make test`, module 02
  with a mistake per graded test; every module's whole corpus (minutes each) in
  `make test-corpus`; the solutions and the blank release of
  every module also in the course run, graded with the course's configuration;
- an answer that computes the single-device MLP from the full weights it is handed passes
  the notebook's check and fails the verifier's: each rank is handed only its own shards.
The attacks on the notebook's verdict (patched checks, launcher, IPython, builtins) are
graded in the fault run's class: tests/test_attacks.py.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import itertools
import os
import pickle
import shutil
import tempfile
import types

import nbformat
import pytest
import torch
from conftest import ROOT

from parlab.check._harness import reset_outcomes
from parlab.grading.autograde.kernels import kernel_manager
from parlab.grading.base.cells import grade_id, is_answer_cell, is_graded_cell
from parlab.grading.base.config import config_value
from parlab.grading.sandbox import Limits, problem
from parlab.grading.verify.remote import Host
from parlab.grading.verify.source import graded_cells, learner_source, released_source
from parlab.grading.verify.verifier import verify
from parlab.sandboxed import wire
from parlab.sandboxed.host import run_source

TP = ROOT / "solutions" / "02_tensor_parallel" / "02_tensor_parallel.ipynb"
FULL_WEIGHTS = '''
class TPMLP(nn.Module):
    """Right numbers from the wrong algorithm: the whole MLP on every rank."""

    def __init__(self, mlp):
        super().__init__()
        self.fc1 = ColumnParallelLinear(mlp.fc1)
        self.fc2 = RowParallelLinear(mlp.fc2)
        self.full = copy.deepcopy(mlp)

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(x)))  # the collectives and gradients of the real thing
        return y + (self.full(x) - y).detach()  # ... and the output of the whole MLP
'''


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


def test_wire_carries_plain_data_only() -> None:
    data = {"y": torch.randn(2, 3, requires_grad=True), "rows": slice(2, 4), "n": (1, 2.5, "x")}
    back = wire.decode(wire.encode(data))
    assert torch.equal(back["y"], data["y"].detach()) and back["rows"] == slice(2, 4)
    with pytest.raises(wire.WireError, match="not plain data"):
        wire.decode(pickle.dumps(_Evil()))
    with pytest.raises(wire.WireError, match="cannot read as data"):
        wire.encode({"model": torch.nn.Linear(2, 2)})
    flat = torch.arange(8.0)  # a shard kept as a view holds the whole storage, there and here
    view, copied = wire.decode(wire.encode([flat[2:4], flat[2:4].clone()]))
    assert torch.equal(view, flat[2:4]) and view.untyped_storage().nbytes() == 32
    assert copied.untyped_storage().nbytes() == 8


def test_a_change_in_place_comes_back_as_data() -> None:
    """What the learner's function changed in its process (a list of costs made prefix sums,
    the tensors inside a list of dicts zeroed) is made to the check's own objects here."""
    from parlab.sandboxed import inplace

    costs, pieces = [1.0, 2.0, 3.0], [{"w": torch.ones(2)}, {"w": torch.ones(3)}]
    theirs = (list(costs), [{"w": p["w"].clone()} for p in pieces])
    before = inplace.snapshot(theirs, {})
    theirs[0][1] += theirs[0][0]
    theirs[1][1]["w"].zero_()
    changed = wire.decode(wire.encode(inplace.changes(before, theirs, {})))
    assert set(changed) == {"0", "1"}
    held = pieces[1]["w"]  # what a check holds on to, compared after the call
    inplace.update(costs, changed["0"])
    inplace.update(pieces, changed["1"])
    assert costs == [1.0, 3.0, 3.0] and held is pieces[1]["w"] and not held.any()
    assert pieces[0]["w"].equal(torch.ones(2))


def test_a_bare_call_in_an_answer_cell_is_not_learner_source() -> None:
    nb = nbformat.read(TP, as_version=4)
    cell = next(c for c in nb.cells if is_answer_cell(c))
    cell.source += "\nimport parlab.check.tp\nsetattr(parlab.check.tp, 'check_f_g', print)\n"
    source = learner_source(nb)
    assert "class CopyToTPRegion" in source and "setattr" not in source
    assert "BEGIN SOLUTION" not in released_source(nb)
    assert "dist.all_reduce(grad)" not in released_source(nb)


def _with_answers(source: nbformat.NotebookNode, answers_from: nbformat.NotebookNode,
                  overlay: str = "") -> nbformat.NotebookNode:
    """The source notebook (its tests, hidden ones included) with another's answers and an
    extra answer cell holding `overlay`, as nbgrader's autograde would run it."""
    nb = copy.deepcopy(source)
    answers = {grade_id(c): c.source for c in answers_from.cells if is_answer_cell(c)}
    for c in nb.cells:
        if is_answer_cell(c):
            c.source = answers[grade_id(c)]
    extra = nbformat.v4.new_code_cell(overlay)
    extra.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "overlay"}
    last = max(i for i, c in enumerate(nb.cells) if is_answer_cell(c))
    nb.cells.insert(last + 1, extra)
    return nb


def _depends(source: nbformat.NotebookNode) -> dict[str, set[str]]:
    """Answer name -> the names its definition uses (the solutions' answer cells)."""
    out: dict[str, set[str]] = {}
    for c in source.cells:
        if c.cell_type == "code" and is_answer_cell(c):
            for stmt in ast.parse(c.source).body:
                names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
                for bound in _bound_names(stmt):
                    out.setdefault(bound, set()).update(names)
    return out


def _bound_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _affected(source: nbformat.NotebookNode, overlay: str, *, direct: bool = False) -> set[str]:
    """The graded tests whose outcome an overlay can change: those naming an answer it
    redefines, or (unless `direct`) one that uses such an answer (its other tests are the
    solutions')."""
    changed = set().union(*(_bound_names(s) for s in ast.parse(overlay).body))
    uses = _depends(source)
    grew = not direct
    while grew:
        more = {n for n, used in uses.items() if used & changed} - changed
        changed |= more
        grew = bool(more)
    return {gid for gid, code, _ in graded_cells(source)
            if {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)} & changed}


def _only(nb: nbformat.NotebookNode, tests: set[str]) -> nbformat.NotebookNode:
    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if not (is_graded_cell(c) and not is_answer_cell(c)
                                              and grade_id(c) not in tests)]
    return out


def _in_notebook(nb: nbformat.NotebookNode) -> dict[str, bool]:
    """Each test's outcome as the learner's kernel has it: the released constants, the imports
    cell and the answer cells run into one fresh module (not in sys.modules, so cloudpickle
    ships its classes by value, as from a notebook), then the test cells' code, hidden tests
    included."""
    module = types.ModuleType(f"learner_notebook_{next(_COUNT)}")
    run_source(released_source(nb), module.__dict__)  # what the tests name: LLAMA3_70B = ...
    for c in nb.cells:
        if c.cell_type == "code" and ("imports" in c.metadata.get("tags", [])
                                      or is_answer_cell(c)):
            with contextlib.suppress(Exception):
                exec(compile(c.source, "<cell>", "exec"), module.__dict__)  # noqa: S102
    ns = module.__dict__
    reset_outcomes()
    outcome = {}
    for gid, code, _ in graded_cells(nb):
        try:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                exec(compile(code, gid, "exec"), ns)  # noqa: S102 - the course's own tests
            outcome[gid] = True
        except Exception:  # noqa: BLE001 - a failed test, whatever it raised
            outcome[gid] = False
    reset_outcomes()
    return outcome
_COUNT = itertools.count()
# The modules the course's configuration has the verifier grade (ResilientExecute.verify_only;
# faultlab's answers are graded in the fault run's class, tests/test_attacks.py): each must
# give every answer of its corpus the notebook's verdicts, test by test.
ONLY = list(config_value("ResilientExecute", "verify_only", []))  # type: ignore[arg-type]
MODULES = [m for m in sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
           if not ONLY or m in ONLY]


def _cases(module: str, *, sample: bool = False) -> list[tuple[str, nbformat.NotebookNode, str]]:
    """(name, whose answers, overlay): the solutions, the blank release, the half-done fake
    student, and every entry of autograder/mistakes/<module>/ on top of the solutions (with
    `sample`, only the first entry, by name, for each graded test naming what it redefines)."""
    source = nbformat.read(ROOT / "solutions" / module / f"{module}.ipynb", as_version=4)
    blank = nbformat.read(ROOT / "course" / module / f"{module}.ipynb", as_version=4)
    half = copy.deepcopy(source)  # carol of parlab.grading.collect.fake: all but the first answer
    first = next(i for i, c in enumerate(half.cells) if is_answer_cell(c))
    half.cells[first] = next(c for c in blank.cells if grade_id(c) == grade_id(half.cells[first]))
    out = [("solutions", source, ""), ("blank", blank, ""), ("half", half, "")]
    if module == "02_tensor_parallel":
        out.append(("full_weights", source, FULL_WEIGHTS))
    reached: set[str] = set()
    for path in sorted((ROOT / "autograder" / "mistakes" / module).glob("*.py")):
        overlay = path.read_text()
        tests = _affected(source, overlay, direct=True)
        if not sample or tests - reached:
            out.append((path.stem, source, overlay))
            reached |= tests
    return out


# Module 02's corpus in `make test`: the solutions, the blank release, the half-done student,
# the full-weights cheat and a mistake per graded test (about 10 of its 26); the whole corpus
# of every module, 02 included, in `make test-corpus` (pytest -m corpus).
SAMPLED = "02_tensor_parallel"


@pytest.mark.slow
@pytest.mark.skipif(problem() is not None, reason="needs the sandbox (make sandbox)")
@pytest.mark.parametrize("module,sample", [
    *[pytest.param(m, False, id=m, marks=pytest.mark.corpus) for m in MODULES],
    pytest.param(SAMPLED, True, id=f"{SAMPLED}-sample")])
def test_verifier_agrees_with_the_notebook(module: str, sample: bool) -> None:
    """For every case of the module, the verifier's verdict on each test it can change equals
    the notebook's (a mistake's other tests are the solutions'); the full-weights cheat passes
    its notebook and fails the verifier on NaN outputs."""
    source = nbformat.read(ROOT / "solutions" / module / f"{module}.ipynb", as_version=4)
    folder = tempfile.mkdtemp(prefix="parlab-verify-")
    os.chmod(folder, 0o755)
    manager = kernel_manager(warm=True, limits=Limits())
    host = Host(manager, folder, "")
    cache: dict = {}
    wrong: dict[str, dict] = {}
    try:
        for name, answers, overlay in _cases(module, sample=sample):
            nb = _with_answers(source, answers, overlay)
            if overlay:
                nb = _only(nb, _affected(source, overlay))
            notebook = _in_notebook(nb)
            verdicts = verify(nb, source, cwd=folder, manager_class=manager, cache=cache,
                              host=host)
            mine = {gid: v.passed for gid, v in verdicts.items()}
            if name == "full_weights":  # right numbers from the wrong algorithm (item 3)
                for gid in ("tp_mlp_test", "tp_block_test"):
                    assert notebook[gid], f"the cheat should pass {gid} in its notebook"
                    assert "nan" in verdicts[gid].message.lower(), verdicts[gid]
                    notebook[gid] = False
            if name == "solutions":
                assert all(notebook.values()), notebook
            if mine != notebook:
                wrong[name] = {g: (notebook[g], verdicts[g].message[:300]) for g in notebook
                               if mine[g] != notebook[g]}
    finally:
        host.close()
        shutil.rmtree(folder, ignore_errors=True)
    assert not wrong, f"{module}: the verifier and the notebook disagree (case: {{test: " \
        f"(notebook passed, the verifier's message)}}): {wrong}"


def test_the_course_run_is_verified_where_the_configuration_says(course_run) -> None:
    """In the course run (the course's own configuration), each module the verifier grades:
    alice's answers pass every test in both the notebook and the verifier; bob's blank
    release fails every test in his notebook, and the verifier runs none of them again (0
    either way). Any other module's tests are marked not verified."""
    from parlab.grading.verify.apply import NOT_NEEDED

    wrong = []
    for module in course_run.sources:
        for student, want in (("alice", {"passed"}), ("bob", {NOT_NEEDED})):
            record = course_run.autograded(student, module).metadata["parlab"]["verifier"]
            seen = {r["verifier"] for r in record.values()}
            expected = want if not ONLY or module in ONLY else {"not verified"}
            if not record or seen != expected:
                wrong.append(f"{module}, {student}: {record}")
    assert not wrong, "\n".join(wrong)


def test_report_names_each_disagreement(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the record holds for a tampering submission reaches `make report`'s summary and
    page, per student and test."""
    from parlab.grading.engines.results import Graded
    from parlab.grading.report import html as report

    monkeypatch.setattr(report, "_points", lambda root, module: {"mean_test": 2.0})
    graded = Graded("faultlab", "mallory", 0.0, 2.0, "graded",
                    cells={"mean_test": (0.0, "VerifierFailed: ...")},
                    disagreements={"mean_test": "the notebook's check passed, the verifier's "
                                                 "failed"})
    reports = report.build(ROOT, [graded])
    text = report.summary(reports)
    assert "DISAGREE mallory, mean_test: the notebook's check passed, the verifier's failed" \
        in text, text
    assert "mallory" in report._module_html(reports[0])
