"""How long a grading process takes to start: parlab.grading's import and nbgrader's command
line, with parlab.grading.base.startup against without it, side by side in one run.

    make bench        or        .venv/bin/python benchmarks/bench_startup.py [--repeats 5]

"Without" imports jsonschema before parlab.grading, which is what a process did before
parlab.grading.base.startup declined rfc3987_syntax (jsonschema then loads it and its grammar). The
contenders take turns (benchmarks/_table.py); each sample is a new Python process. Memory:
the peak RSS of that process (VmHWM, printed by the process as it exits; the largest of its
samples).
"""

from __future__ import annotations

import subprocess
import sys

from _memory import mib
from _table import Table, interleave, medians, ratio, repeats_option, setting

from parlab.grading import AUTOGRADER_DIR

WITH, WITHOUT = "with parlab.grading.base.startup", "without (jsonschema imported first)"
COMMANDS = {  # what starts -> (with, without): the code a fresh `python -c` runs
    "import parlab.grading": ("import parlab.grading",
                              "import jsonschema, parlab.grading"),
    "nbgrader --version": (
        "import runpy, sys; sys.argv = ['nbgrader', '--version']; "
        "runpy.run_module('parlab.grading.base.nbgrader_cli', run_name='__main__')",
        "import jsonschema, runpy, sys; sys.argv = ['nbgrader', '--version']; "
        "runpy.run_module('parlab.grading.base.nbgrader_cli', run_name='__main__')"),
}
PEAKS: dict[str, int] = {}


# VmHWM, not ru_maxrss: the latter counts the parent's pages from before the exec (Linux)
PEAK = ("import atexit; atexit.register(lambda: print('PEAK', [ln.split()[1] for ln in "
        "open('/proc/self/status') if ln.startswith('VmHWM:')][0], flush=True)); ")  # kB


def _python(code: str, label: str) -> None:
    out = subprocess.run([sys.executable, "-c", PEAK + code], check=True, capture_output=True,
                         text=True, cwd=AUTOGRADER_DIR).stdout
    peak = int(out.rsplit("PEAK ", 1)[1].split()[0]) * 1024
    PEAKS[label] = max(PEAKS.get(label, 0), peak)


def main() -> None:
    repeats = repeats_option(__doc__, default=5)
    table = Table(setting("starting a grading process (a fresh Python each sample); peak RSS "
                          "MiB of the process (its largest sample)", repeats),
                  ["starts", "how", "median s", "x with", "peak RSS MiB"])
    for what, (fast, slow) in COMMANDS.items():
        contenders = {f"{what} {WITH}": lambda c=fast, w=what: _python(c, f"{w} {WITH}"),
                      f"{what} {WITHOUT}": lambda c=slow, w=what: _python(c, f"{w} {WITHOUT}")}
        times = medians(interleave(contenders, repeats))
        base = times[f"{what} {WITH}"]
        for how in (WITH, WITHOUT):
            name = f"{what} {how}"
            table.add(what, how, f"{times[name]:.2f}", ratio(times[name], base),
                      mib(PEAKS[name]))
    table.emit("startup")


if __name__ == "__main__":
    main()
