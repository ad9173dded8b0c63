"""scripts/train.py --trace PATH under torchrun: one merged Chrome trace, one row per rank,
with the step's communication inside it (the course's tracer names each call)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import ROOT

from parlab.timeline import load


@pytest.mark.slow  # torchrun starts in seconds, not milliseconds
def test_a_torchrun_job_writes_one_merged_trace(torchrun, tmp_path):
    out = tmp_path / "train.json"
    proc = subprocess.run(
        [*torchrun.cmd, "--standalone", "--nproc-per-node", "2", str(ROOT / "scripts" /
         "train.py"), "--tensor-model-parallel-size", "2", "--train-iters", "1", "--trace",
         str(out)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env=torchrun.env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"trace of 2 ranks: {out}" in proc.stdout
    data = json.loads(out.read_text())
    rows = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "process_name"}
    assert rows == {0: "rank 0", 1: "rank 1"}
    tl = load(out)
    for rank in (0, 1):  # TP's all-reduces, as the tracer saw them
        assert tl.ranges(rank=rank, prefix="comm all_reduce"), rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.json"]  # no part left over
