"""`standing()`: the learner's standing in a module, from the notebook itself.

The last cell of every module notebook calls it:

    from parlab.grading import standing
    standing()

It runs the self-check (`make check`, parlab.grading.learner.selfcheck) on the SAVED notebook
file, in a fresh kernel, and prints the same table: each visible test passed, failed with its
message, or timed out, with its points. It reads the file on disk, so save first; it takes about
as long as running the whole notebook. `module` defaults to the module whose folder the kernel
runs in (workspace/<module>/ or course/<module>/).

It does nothing (one line says it is skipped) when the notebook is itself being run by a
grading tool, so it never recurses and never slows grading down: under nbgrader autograde or
validate (NBGRADER_EXECUTION is set), in the self-check's own kernel or a notebook run by
parlab.grading.execute_notebook (PARLAB_SELFCHECK=1), and under pytest (PYTEST_CURRENT_TEST).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from parlab.grading.base.notebooks import SELFCHECK_ENV
from parlab.grading.base.paths import COURSE_DIR, REPO_ROOT, list_modules
from parlab.grading.learner.selfcheck import learner_notebook

READ = "this notebook, as last saved"  # how the table names the file it read


def skip_reason(env: dict[str, str] | None = None) -> str | None:
    """Why standing() must not run a self-check here, or None."""
    env = dict(os.environ) if env is None else env
    if env.get("NBGRADER_EXECUTION"):
        return f"this notebook is being run by nbgrader {env['NBGRADER_EXECUTION']}"
    if env.get(SELFCHECK_ENV):
        return "this notebook is being run by the self-check (make check) or a grading tool"
    if env.get("PYTEST_CURRENT_TEST"):
        return "this notebook is being run by a test"
    return None


def module_here(cwd: Path) -> str | None:
    """The module whose folder `cwd` is: a folder holding <its name>.ipynb, or named as a
    released module."""
    if (cwd / f"{cwd.name}.ipynb").exists() or cwd.name in list_modules(COURSE_DIR):
        return cwd.name
    return None


def standing(module: str | None = None) -> None:
    """Print the self-check's table for the saved notebook of `module` (see the module doc)."""
    if why := skip_reason():
        print(f"standing(): skipped, {why}.")
        return
    cwd = Path.cwd()
    module = module or module_here(cwd)
    if module is None:
        print(f"standing(): {cwd} is not a module's folder; name the module, e.g. "
              "standing('02_tensor_parallel').")
        return
    here = cwd / f"{module}.ipynb"
    path = here if here.exists() else learner_notebook(module)[0]
    print(f"Checking the SAVED file {path}: save the notebook first (Ctrl+S / Cmd+S), changes "
          "not saved are not seen. It runs in a fresh kernel, so this takes about as long as "
          "running the whole notebook.", flush=True)
    cmd = [sys.executable, "-m", "parlab.grading", "check", module, "--notebook", str(path),
           "--which", READ]
    if (release := COURSE_DIR / module / f"{module}.ipynb").exists():
        cmd += ["--release", str(release)]
    env = dict(os.environ, **{SELFCHECK_ENV: "1"})
    with subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
