"""The verifier (parlab.grading.verify, issue 30): verdicts decided in a process that never
ran learner code, from plain data, against references it made itself.

- the wire refuses anything but plain data, both ways;
- what of a notebook runs where: a bare call in an answer cell (the place a patch goes) is
  not part of the learner's source, and the released source holds no answer;
- module 02, on the solutions, the blank release, and mistakes of autograder/mistakes/: the
  verifier's verdict per test equals the notebook's (its test cells run here, on the same
  answers, as the kernel would run them);
- an answer that computes the single-device MLP from the full weights it is handed passes
  the notebook's check and fails the verifier's: each rank is handed only its own shards.
The attacks on the notebook's verdict (patched checks, launcher, IPython, builtins) are
graded in the fault run's class: tests/test_attacks.py.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import tempfile

import nbformat
import pytest
import torch
from conftest import ROOT
from mistakes import learner_namespace

from parlab.check._harness import reset_outcomes
from parlab.grading.cells import grade_id, is_answer_cell
from parlab.grading.kernels import kernel_manager
from parlab.grading.sandbox import Limits, problem
from parlab.grading.verify import verify
from parlab.grading.verify.source import graded_cells, learner_source, released_source
from parlab.sandboxed import wire

TP = ROOT / "solutions" / "02_tensor_parallel" / "02_tensor_parallel.ipynb"
BLANK = ROOT / "course" / "02_tensor_parallel" / "02_tensor_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "02_tensor_parallel"
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


def test_a_bare_call_in_an_answer_cell_is_not_learner_source() -> None:
    nb = nbformat.read(TP, as_version=4)
    cell = next(c for c in nb.cells if is_answer_cell(c))
    cell.source += "\nimport parlab.check.tp\nsetattr(parlab.check.tp, 'check_f_g', print)\n"
    source = learner_source(nb)
    assert "class CopyToTPRegion" in source and "setattr" not in source
    assert "BEGIN SOLUTION" not in released_source(nb)
    assert "dist.all_reduce(grad)" not in released_source(nb)


def _notebook(answers_from: nbformat.NotebookNode, overlay: str = "") -> nbformat.NotebookNode:
    """The solutions notebook (its tests, hidden ones included) with another's answers and an
    extra answer cell holding `overlay`, as nbgrader's autograde would run it."""
    nb = nbformat.read(TP, as_version=4)
    answers = {grade_id(c): c.source for c in answers_from.cells if is_answer_cell(c)}
    for c in nb.cells:
        if is_answer_cell(c):
            c.source = answers[grade_id(c)]
    extra = nbformat.v4.new_code_cell(overlay)
    extra.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "overlay"}
    last = max(i for i, c in enumerate(nb.cells) if is_answer_cell(c))
    nb.cells.insert(last + 1, extra)
    return nb


def _in_notebook(nb: nbformat.NotebookNode, overlay: str) -> dict[str, bool]:
    """Each test's outcome as the learner's kernel has it: the answers, then the test cells'
    code, in one namespace (tests/mistakes.py)."""
    answers = sum(is_answer_cell(c) for c in nb.cells) - 1
    with tempfile.NamedTemporaryFile("w", suffix=".ipynb", delete=False) as f:
        plain = copy.deepcopy(nb)
        plain.cells = [c for c in plain.cells if grade_id(c) != "overlay"]
        nbformat.write(plain, f)
    ns = learner_namespace(f.name, overlay, answers=answers).__dict__
    reset_outcomes()
    outcome = {}
    for gid, code, _ in graded_cells(nb):
        try:
            with io.StringIO() as out, __import__("contextlib").redirect_stdout(out):
                exec(compile(code, gid, "exec"), ns)  # noqa: S102 - the course's own tests
            outcome[gid] = True
        except Exception:  # noqa: BLE001
            outcome[gid] = False
    reset_outcomes()
    return outcome


CASES = {"solutions": ("solutions", ""), "blank": ("blank", ""),
         "full_weights": ("solutions", FULL_WEIGHTS)}
CASES.update({p.stem: ("solutions", p.read_text()) for p in sorted(MISTAKES.glob("*.py"))
              if p.stem in ("extra_g", "wrong_shard", "missing_backward_allreduce")})
CACHE: dict = {}


@pytest.mark.slow
@pytest.mark.skipif(problem() is not None, reason="needs the sandbox (make sandbox)")
@pytest.mark.parametrize("case", list(CASES))
def test_verifier_agrees_with_the_notebook_on_module_02(case: str) -> None:
    base, overlay = CASES[case]
    nb = _notebook(nbformat.read(TP if base == "solutions" else BLANK, as_version=4), overlay)
    notebook = _in_notebook(nb, overlay)
    folder = tempfile.mkdtemp(prefix="parlab-verify-")
    os.chmod(folder, 0o755)
    verdicts = verify(nb, nbformat.read(TP, as_version=4), cwd=folder,
                      manager_class=kernel_manager(warm=True, limits=Limits()), cache=CACHE)
    mine = {gid: v.passed for gid, v in verdicts.items()}
    if case == "full_weights":  # item 3: right numbers from the wrong algorithm
        for gid in ("tp_mlp_test", "tp_block_test"):  # TPBlock uses the learner's TPMLP
            assert notebook[gid], f"the cheat should pass {gid} in its notebook"
            assert mine[gid] is False, verdicts[gid]
            assert "nan" in verdicts[gid].message.lower(), verdicts[gid]
            notebook[gid] = False
    if case == "solutions":
        assert all(notebook.values()), notebook
    if case == "blank":
        assert not any(notebook.values()), notebook
    assert mine == notebook, {g: (notebook[g], verdicts[g].message[:300]) for g in notebook
                              if mine[g] != notebook[g]}
