"""benchmarks/bench_class.py at 3 students: the fast path grades as the plain one.

The benchmark grades each distinct notebook alone with the plain executor (fresh kernels,
every cell run), then the class through the instructor command with the course's
configuration (warm kernels, nothing after the last graded cell); every student's score in
every test cell must equal its notebook's graded alone. The variants must also differ from
one another (full marks, zero, and partial scores), or the comparison would prove nothing.
"""

from __future__ import annotations

import shutil
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_class  # noqa: E402

pytestmark = pytest.mark.slow


def test_class_of_three_scores_as_each_notebook_graded_alone(tmp_path) -> None:
    root = tmp_path / "course"
    who = bench_class.prepare(root, 3)  # the answered, blank and a partly right notebook
    try:
        result = bench_class.grade_class(root, who, workers=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    totals = {s: sum(v for v in cells.values() if v) for s, cells in result.reference.items()}
    assert len(result.reference) == 3 and len(set(totals.values())) >= 3, (
        f"the variants should score differently alone: {totals}")
    assert totals["alone-blank"] == 0 and totals["alone-answered"] == max(totals.values())
    assert result.students == 3 and not result.wrong, bench_class.report(result)
    assert result.phases["tests"][0] > 0, "no notebook recorded its profile"
