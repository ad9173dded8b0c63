"""Store in every course notebook the kernel metadata JupyterLab would write on opening it.

    .venv/bin/python scripts/stamp_notebooks.py            # stamp solutions/ and course/
    .venv/bin/python scripts/stamp_notebooks.py --check    # exit 1 if one needs stamping

JupyterLab, on connecting a kernel, sets the notebook's `kernelspec` and `language_info` to the
kernel's, and marks the notebook modified when they differ from what is stored (a deep
comparison; `language_info` holds the Python version). Storing the kernel's own values means a
learner who opens a notebook and closes it is not asked to save it, with the course's Python
(environment.yml pins 3.11; another version still differs in `version` only).

Only notebook-level metadata is written, never a cell; the JSON is written as nbformat writes
it (sorted keys, indent 1), so the diff is those lines alone. `make release` copies the
metadata from solutions/ into course/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parlab.grading import COURSE_DIR, SOLUTIONS_DIR
from parlab.grading.base.notebooks import kernel_metadata


def notebooks() -> list[Path]:
    """The module notebooks of solutions/ and course/."""
    return sorted(p for top in (SOLUTIONS_DIR, COURSE_DIR) for p in top.glob("*/*.ipynb"))


def stamp(path: Path, wanted: dict, *, write: bool) -> bool:
    """Whether `path` needed stamping; write it when `write`."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if all(data["metadata"].get(k) == v for k, v in wanted.items()):
        return False
    if write:
        data["metadata"].update(wanted)
        path.write_text(json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if needed")
    args = parser.parse_args()
    wanted = kernel_metadata()
    changed = [p for p in notebooks() if stamp(p, wanted, write=not args.check)]
    for path in changed:
        print(f"{'needs stamping' if args.check else 'stamped'}: {path}")
    print(f"{len(changed)} of {len(notebooks())} notebooks "
          f"{'need' if args.check else 'got'} the kernel's metadata "
          f"(Python {wanted['language_info'].get('version')})")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
