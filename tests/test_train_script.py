"""scripts/train.py: Megatron-LM's argument names map onto the grid, and two torchrun "nodes"
on one machine (c10d rendezvous on 127.0.0.1) train the Llama with the single-device losses."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, Torchrun, torchrun_tmp

from parlab.compose import TOLERANCE, Plan, train_single
from parlab.model import LlamaConfig

SCRIPT = ROOT / "scripts" / "train.py"


def _load(script: str):
    path = ROOT / "scripts" / script
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script():
    return _load("train.py")


def _plan(argv: list[str], world: int) -> tuple[LlamaConfig, Plan]:
    script = _script()
    return script.plan_from_args(script.parser().parse_args(argv), world)


def test_megatron_arguments_map_onto_the_grid():
    _, plan = _plan(["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                     "2", "--sequence-parallel"], 8)
    assert (plan.dp, plan.pp, plan.tp, plan.sequence_parallel) == (2, 2, 2, True)  # DP: rest
    _, plan = _plan(["--pipeline-model-parallel-size", "2",
                     "--num-layers-per-virtual-pipeline-stage", "1"], 2)
    assert (plan.virtual, plan.schedule) == (2, "interleaved_1f1b")
    cfg, plan = _plan(["--num-experts", "4", "--expert-model-parallel-size", "2",
                       "--moe-layer-freq", "2", "--context-parallel-size", "2"], 8)
    assert (plan.dp, plan.ep, plan.cp) == (2, 2, 2) and cfg.moe_layers == (0, 2)  # DP 4 = 2·EP
    cfg, _ = _plan(["--num-query-groups", "4", "--untie-embeddings-and-output-weights"], 1)
    assert (cfg.kv_heads, cfg.tied) == (4, False)
    _, plan = _plan(["--use-distributed-optimizer"], 4)  # Megatron's name for ZeRO-1
    assert (plan.dp, plan.distributed_optimizer) == (4, True)
    args = _script().parser().parse_args(["--save", "a", "--save-interval", "5", "--load", "b",
                                          "--ckpt-step", "10"])
    assert (args.save, args.save_interval, args.load, args.ckpt_step) == ("a", 5, "b", 10)


@pytest.mark.parametrize("argv, world, words", [
    (["--tensor-model-parallel-size", "4"], 6, "DP is what the world size leaves"),
    (["--expert-model-parallel-size", "3", "--num-experts", "6"], 4, "multiple of EP"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"],
     2, "virtual"),
    (["--use-distributed-optimizer", "--num-experts", "4", "--expert-model-parallel-size", "2"],
     2, "distributed optimizer here shards dense replicas only"),
])
def test_arguments_that_cannot_run_say_why(argv, world, words):
    with pytest.raises(ValueError, match=words):
        _plan(argv, world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ARGS = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--sequence-parallel", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "3", "--check"]


def _two_nodes(torchrun: Torchrun, tmp: Path, timeout: float) -> list[tuple[int, str]]:
    """Start both "nodes", wait for both; (exit code, output) each. Both process groups are
    killed if anything goes wrong or the deadline passes."""
    endpoint, rdzv_id = f"127.0.0.1:{_free_port()}", uuid.uuid4().hex[:8]
    cmd = [*torchrun.cmd, "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id, str(SCRIPT), *ARGS]
    procs, logs = [], [tmp / f"node{i}.log" for i in range(2)]
    env = torchrun.env(PYTHONUNBUFFERED="1")
    try:
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True))
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(code, log.read_text()) for code, log in zip(codes, logs, strict=True)]


@pytest.mark.slow
def test_two_torchrun_nodes_train_with_the_single_device_losses(torchrun, tmp_path):
    start = time.perf_counter()
    nodes = _two_nodes(torchrun, tmp_path, timeout=300)
    output = "\n".join(out for _, out in nodes)
    assert all(code == 0 for code, _ in nodes), output
    print(f"two nodes of 4 processes: {time.perf_counter() - start:.0f} s")
    assert "8 ranks on 2 node(s): DP 2 × PP 2 × TP 2 with SP" in output, output
    losses = [float(x) for x in re.findall(r"iteration +\d+/3 .* loss ([0-9.]+) \|", output)]
    assert len(losses) == 3 and "tokens/s" in output, output
    single = train_single(LlamaConfig(), 3, global_batch_size=8, lr=3e-3)
    assert max(abs(a - b) for a, b in zip(losses, single, strict=True)) <= TOLERANCE + 1e-6
    assert f"tolerance {TOLERANCE:.0e}: OK" in output, output


@pytest.mark.parametrize("script, argv, world, words", [
    ("train.py", ["--tensor-model-parallel-size", "4"], 8, "tp=4 must divide heads=4"),
    ("train.py", ["--tensor-model-parallel-size", "4"], 6, "DP is what the world size leaves"),
    ("capstone.py", ["--dp", "2", "--tp", "2", "--hidden", "30"], 4, "hidden=30"),
    ("capstone.py", ["--dp", "2", "--tp", "2"], 8, "but 8 ranks are running"),
])
def test_options_that_do_not_fit_end_every_process_before_a_group_starts(
        script, argv, world, words, monkeypatch, capsys):
    """Each process as torchrun starts it (WORLD_SIZE, RANK): rank 0 says why in one message,
    the others say nothing, all exit 2 (a usage error), and none starts a process group."""
    module = _load(script)

    def no_group(*args, **kwargs):
        raise AssertionError("init_process_group was reached")

    monkeypatch.setattr(module, "init_distributed", no_group)
    for rank in (0, world - 1):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(SystemExit) as info:
            module.main(argv)
        out, err = capsys.readouterr()
        assert info.value.code == 2, err
        if rank == 0:
            assert words in err and err.count("error:") == 1 and not out, err
        else:
            assert not (out + err).strip(), err


@pytest.mark.usefixtures("no_orphans")
def test_under_torchrun_options_that_do_not_fit_print_one_message(torchrun):
    proc = subprocess.run([*torchrun.cmd, "--standalone", "--nproc-per-node", "2", str(SCRIPT),
                           "--tensor-model-parallel-size", "2", "--num-query-groups", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=torchrun.env())
    # torchrun kept its logs in the test's own folder (removed after it), not in /tmp
    assert list(torchrun.tmp.glob("torchelastic_*")), list(torchrun.tmp.iterdir())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count("train.py: error: tp=2 must divide") == 1, out
    assert 'scripts/train.py", line' not in out, out  # no rank's traceback


def test_torchrun_in_tests_leaves_nothing_in_tmp():
    """torchrun leaves a torchelastic_* folder of logs in its TMPDIR after every run (19 in
    /tmp after a day's runs of the suite): every test starts it through conftest's `torchrun`
    fixture, whose TMPDIR is a folder of the test's own, removed after it (the test above
    checks that torchrun writes there)."""
    with torchrun_tmp() as t:
        (t.tmp / "torchelastic_x" / "run_0").mkdir(parents=True)  # what a run leaves
        assert t.env()["TMPDIR"] == str(t.tmp)
    assert not t.tmp.exists(), "the fixture's folder outlived the test"
    started, given = re.compile(r"\*torchrun\.cmd"), re.compile(r"torchrun\.env\(")
    own = re.compile(r'/\s*"torchrun"')  # the venv's torchrun, not from the fixture
    bypass = [p.name for p in sorted(Path(__file__).parent.glob("test_*.py"))
              if own.search(p.read_text()) or len(started.findall(p.read_text())) >
              len(given.findall(p.read_text()))]
    assert not bypass, f"tests that start torchrun without conftest's torchrun fixture: {bypass}"
