"""The class's grading record: what was graded from which files, so a re-run grades only news.

autograded/.parlab/record.json holds, per (module, student), the checksum of the submitted
files, of the module's source (solutions/<module>/) and of the grading configuration
(autograder/nbgrader_config.py and the extra nbgrader options) at the time it was graded, and
the result (`Graded`). `make autograde` grades a submission only when one of them changed, it
has no score, or its autograded notebook is gone; `ALL=1` grades everything again. A run
updates only the entries it graded, so a partial run (STUDENT=, MODULE=, or a few new
submissions) never overwrites what an earlier full run recorded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from parlab.grading.base.paths import AUTOGRADER_DIR
from parlab.grading.engines.results import Graded

Pair = tuple[str, str]  # (module, student)


def _record_path(root: Path) -> Path:
    return Path(root) / "autograded" / ".parlab" / "record.json"


def checksum(folder: Path) -> str:
    """sha256 over the names and bytes of every file below `folder` (hidden ones skipped)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def config_checksum(nbgrader_args: Iterable[str]) -> str:
    """sha256 of the grading configuration: nbgrader_config.py and the extra options."""
    text = (AUTOGRADER_DIR / "nbgrader_config.py").read_bytes()
    return hashlib.sha256(text + "\0".join(nbgrader_args).encode()).hexdigest()


def load_record(root: Path) -> dict[str, dict]:
    """The record ({"module/student": entry}); {} when nothing was graded yet."""
    path = _record_path(root)
    return json.loads(path.read_text()) if path.exists() else {}


def fingerprints(root: Path, pairs: Iterable[Pair], nbgrader_args: Iterable[str]) -> dict:
    """{pair: {"submission", "source", "config"} checksums} as they are now."""
    config = config_checksum(nbgrader_args)
    sources: dict[str, str] = {}
    out = {}
    for m, s in pairs:
        if m not in sources:
            sources[m] = checksum(Path(root) / "solutions" / m)
        out[(m, s)] = {"submission": checksum(Path(root) / "submitted" / s / m),
                       "source": sources[m], "config": config}
    return out


def stale(root: Path, pairs: Iterable[Pair], now: dict) -> list[Pair]:
    """The pairs that need grading: new, changed (submission, source or configuration), with
    no score, or whose autograded notebook is gone."""
    record = load_record(root)
    todo = []
    for m, s in pairs:
        entry = record.get(f"{m}/{s}")
        graded = Path(root) / "autograded" / s / m / f"{m}.ipynb"
        if (entry is None or entry.get("result", {}).get("score") is None
                or any(entry.get(k) != v for k, v in now[(m, s)].items())
                or not graded.exists()):
            todo.append((m, s))
    return todo


def update_record(root: Path, results: list[Graded], now: dict, unsafe: bool = False) -> None:
    """Write this run's results into the record, leaving every other entry as it was;
    `unsafe`: graded without the sandbox (each entry says so)."""
    record = load_record(root)
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    for r in results:
        record[f"{r.module}/{r.student}"] = {**now[(r.module, r.student)], "graded_at": stamp,
                                             "sandbox": not unsafe, "result": r.__dict__}
    path = _record_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True, default=str))


def graded_unsafe(root: Path) -> list[tuple[str, str]]:
    """("module/student", when) of each submission whose latest grade came from a run
    without the sandbox (`make autograde UNSAFE=1`)."""
    return [(key, entry.get("graded_at", "?")) for key, entry in sorted(
        load_record(root).items()) if entry.get("sandbox") is False]


def class_results(root: Path) -> list[Graded]:
    """Every submission's latest result, from the record, by module then student."""
    results = []
    for _key, entry in sorted(load_record(root).items()):
        r = entry["result"]
        results.append(Graded(**{**r, "cells": {k: tuple(v) for k, v in r["cells"].items()}}))
    return results
