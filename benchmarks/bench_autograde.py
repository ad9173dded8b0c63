"""How long `nbgrader autograde` takes for one fully answered submission of each module.

    make bench        or        .venv/bin/python benchmarks/bench_autograde.py [--repeats 1]

In a temporary course root: every module of solutions/ released with the gradebook on
(`parlab.grading.generate_release`), one student's submission per module built from the
solutions (`fake_submission`, as tests/grading_runs.py does), then one `nbgrader autograde`
call per module (`parlab.grading.autograde`: the real command line, our nbgrader_config.py,
the notebook executed with its hidden tests put back). Reported per module: the median wall
time of the call (nbgrader's ~3 s start-up included) and the score the gradebook holds,
which must be full marks. With --repeats N the modules take turns, N rounds; the default is
one round, since a round grades every module (minutes on 2 cores). Memory: each call runs in
a forked process of its own, and the column shows the largest peak RSS among the processes
it started (nbgrader, the notebook's kernel, ...; benchmarks/_memory.py), largest over rounds.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

import nbformat
from _memory import children_peak_rss, mib
from _table import Table, repeats_option, setting

from parlab.grading import SOLUTIONS_DIR, autograde, fake_submission, generate_release, list_modules

STUDENT = "alice"


def prepare(root: Path) -> list[str]:
    """Release every module into `root` (gradebook on) and submit a full answer to each."""
    modules = list_modules(SOLUTIONS_DIR)
    for module in modules:
        shutil.copytree(SOLUTIONS_DIR / module, root / "solutions" / module,
                        ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"))
    generate_release("*", root=root, database=True)
    for module in modules:
        name = f"{module}.ipynb"
        folder = root / "submitted" / STUDENT / module
        shutil.copytree(root / "course" / module, folder)
        answered = fake_submission(root / "solutions" / module / name,
                                   root / "course" / module / name)
        nbformat.write(answered, str(folder / name))
    return modules


def grade(root: Path, module: str) -> tuple[float, float | None, float]:
    """One autograde call: (seconds, score, max score)."""
    result = autograde(root, module)
    return result.run.seconds, result.scores[module][STUDENT], result.max_scores[module]


def main() -> None:
    repeats = repeats_option(__doc__, default=1)
    root = Path(tempfile.mkdtemp(prefix="parlab-bench-autograde-"))
    try:
        modules = prepare(root)
        seconds: dict[str, list[float]] = {m: [] for m in modules}
        scores: dict[str, tuple[float | None, float]] = {}
        peaks: dict[str, int] = dict.fromkeys(modules, 0)
        for i in range(repeats):
            for module in modules if i % 2 == 0 else modules[::-1]:
                (took, score, total), peak = children_peak_rss(
                    lambda module=module: grade(root, module))
                seconds[module].append(took)
                scores[module] = (score, total)
                peaks[module] = max(peaks[module], peak)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(setting("nbgrader autograde of one fully answered submission per module, "
                          "wall seconds per call, peak RSS MiB of its largest process", repeats),
                  ["module", "autograde s", "score", "full marks", "peak RSS MiB"])
    for module in modules:
        score, total = scores[module]
        table.add(module, f"{statistics.median(seconds[module]):.1f}", f"{score} / {total}",
                  "yes" if score == total else "NO", mib(peaks[module]))
    table.emit("autograde")
    if any(score != total for score, total in scores.values()):
        raise SystemExit("a fully answered submission did not get full marks (table above)")


if __name__ == "__main__":
    main()
