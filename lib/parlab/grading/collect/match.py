"""Which module a handed-in notebook belongs to, whatever its file is called.

A learner's file may be `02_tensor_parallel (1).ipynb`, `Copy of 02_tensor_parallel.ipynb` or
their own name; its cells still carry the nbgrader grade ids of the release it came from. A
notebook is matched to the module whose released grade ids it shares most; a file that cannot
be read is matched by a module name inside its file name, if any.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from parlab.grading.base.paths import list_modules


@dataclass(frozen=True)
class Match:
    """A module for a notebook (None when there is none), and how it was decided."""

    module: str | None
    how: str  # "by name", "by its cells", "by a module name in its file name", or why not


def released_ids(root: Path) -> dict[str, set[str]]:
    """{module: grade ids of its cells}, from course/ (the release), else solutions/."""
    ids = {}
    modules = set(list_modules(root / "course")) | set(list_modules(root / "solutions"))
    for module in sorted(modules):
        for top in ("course", "solutions"):
            path = root / top / module / f"{module}.ipynb"
            if path.exists():
                ids[module] = _grade_ids(path) or set()
                break
    return ids


def _grade_ids(path: Path) -> set[str] | None:
    """Grade ids in a notebook file, read leniently; None when it is not readable JSON."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        return None
    return {str(gid) for c in cells if isinstance(c, dict)
            if (gid := ((c.get("metadata") or {}).get("nbgrader") or {}).get("grade_id"))}


def match_module(path: Path, ids: dict[str, set[str]]) -> Match:
    """The module `path` was made from: its own name, else its grade ids, else a name in it."""
    if path.stem in ids:
        return Match(path.stem, "by name")
    mine = _grade_ids(path)
    if mine is None:
        named = sorted((m for m in ids if m in path.name), key=len, reverse=True)
        if named:
            return Match(named[0], "by a module name in its file name (it cannot be read)")
        return Match(None, "it cannot be read as a notebook and its name names no module")
    shared = {m: len(mine & gids) for m, gids in ids.items()}
    best = max(shared.values(), default=0)
    if best == 0:
        return Match(None, f"none of its {len(mine)} nbgrader cells belongs to a released "
                     f"module ({', '.join(ids) or 'none released'})")
    winners = sorted(m for m, n in shared.items() if n == best)
    if len(winners) > 1:
        return Match(None, f"its cells match {' and '.join(winners)} equally")
    return Match(winners[0], f"by its cells ({best} of {len(ids[winners[0]])} grade ids)")
