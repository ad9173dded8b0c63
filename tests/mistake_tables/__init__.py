"""One table a module: what its mistakes tests need that the others do not (tests/mistakes.py,
`Table`): the checks as the module's test cells call them, the world sizes they run at, the
entries the issues asked for, what a message must name, the course code an answer may not
hand back. tests/test_mistakes.py runs the same tests over every table in TABLES.
"""

from __future__ import annotations

from mistake_tables import (
    checkpoint,
    collectives,
    composition,
    cp,
    fsdp,
    moe,
    pp,
    sp,
    tp,
    whole,
)

TABLES = [m.TABLE for m in (collectives, fsdp, tp, sp, pp, cp, moe, composition, whole,
                            checkpoint)]
BY_MODULE = {table.module: table for table in TABLES}
