"""Imported first by parlab.grading: one optional import declined, about 1 s of every start.

nbformat imports jsonschema, and jsonschema imports rfc3987_syntax, when it is installed, for
its optional "iri" format checker; that module compiles an Earley grammar as it is imported,
about 1.1 s on a 2-core machine: half of what `import parlab.grading` costs, more than torch's
own import. Every process that grades paid it: the `python -m parlab.grading` command line,
each nbgrader step (`NBGRADER`, parlab.grading.base.nbgrader_cli) and a kernel's standing() cell.
Nothing there checks string formats (nbformat validates notebooks without a format checker),
so the import is declined before nbformat loads: jsonschema then leaves "iri" unchecked,
exactly as when the package is not installed. A process that imported jsonschema first keeps
the checker. benchmarks/bench_startup.py measures the difference.
"""

from __future__ import annotations

import sys

DECLINED = "rfc3987_syntax"
# `nbgrader ARGS` as parlab.grading.base.runner and parlab.grading.engines.local run it
NBGRADER = (sys.executable, "-m", "parlab.grading.base.nbgrader_cli")

if "jsonschema" not in sys.modules:
    sys.modules.setdefault(DECLINED, None)  # type: ignore[arg-type]  # import -> ImportError
