"""NCCL's rules on gloo (parlab.launch.nccl_rules) and the device rule (parlab.launch.devices).

Without a GPU: a 2-rank ring that posts its receive first (gloo runs it, NCCL deadlocks) fails
with PARLAB_NCCL_RULES=1, naming both calls and the fix, while an even-ranks-send-first ring
and a batch_isend_irecv ring pass for several world sizes; a collective given a tensor off the
rank's device fails at the call (the rank's device faked as another one); the backend chosen
from PARLAB_BACKEND and PARLAB_GPUS; `uses_nccl` reads a device map; results come back on the
CPU whatever device their tensors were on; ranks compute float32 without TF32.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT

from parlab import launch
from parlab.launch import NcclRuleBroken, RankError, devices, run
from parlab.launch.nccl_rules import Call, check_pairs
from parlab.launch.rank import on_cpu


def _ring(order: str, gloo_group: bool = False) -> torch.Tensor:
    """One step of a ring: send this rank's row right, receive the left one's (on a copy of
    the world made with backend="gloo" if asked)."""
    rank, w = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(w)), backend="gloo") if gloo_group else None
    mine, got = torch.full((3,), float(rank)), torch.empty(3)
    right, left = (rank + 1) % w, (rank - 1) % w
    if order == "batched":
        for op in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                          dist.P2POp(dist.irecv, got, left)]):
            op.wait()
        return got
    recv_first = order == "recv_first" or (order == "even_send_first" and rank % 2 == 1)
    ops = [lambda: dist.irecv(got, left, group), lambda: dist.isend(mine, right, group)]
    for work in [post() for post in (ops if recv_first else ops[::-1])]:
        work.wait()
    return got


@pytest.fixture
def rules(monkeypatch):
    monkeypatch.setenv("PARLAB_NCCL_RULES", "1")


def test_a_recv_first_two_rank_ring_breaks_ncclss_order(rules) -> None:
    with pytest.raises(NcclRuleBroken) as info:
        run(_ring, 2, "recv_first")
    text = str(info.value)
    assert "NCCL would deadlock" in text and "both receive first" in text, text
    assert text.count("irecv(tensor (3,) float32) at") == 2, "both calls named"
    assert "test_nccl_rules.py" in text and "batch_isend_irecv" in text, text


def test_the_same_ring_runs_without_the_rules(monkeypatch) -> None:
    monkeypatch.delenv("PARLAB_NCCL_RULES", raising=False)
    assert [r.tolist() for r in run(_ring, 2, "recv_first")] == [[1.0] * 3, [0.0] * 3]


def test_what_stays_gloo_on_a_gpu_box_is_not_held_to_ncclss_rules(rules) -> None:
    want = [[1.0] * 3, [0.0] * 3]
    assert [r.tolist() for r in run(_ring, 2, "recv_first", backend="gloo")] == want
    assert [r.tolist() for r in run(_ring, 2, "recv_first", True)] == want  # a gloo group


@pytest.mark.parametrize("w", [2, 3, 4])
@pytest.mark.parametrize("order", ["even_send_first", "batched"])
def test_rings_that_pair_up_pass_for_every_world_size(rules, order: str, w: int) -> None:
    got = run(_ring, w, order)
    assert [r.tolist() for r in got] == [[float((r - 1) % w)] * 3 for r in range(w)]


def _calls(rank: int, spec: str) -> list[Call]:
    """'s r [s r] s': sends and receives with the other rank of a pair, [..] one batch."""
    calls, batch, n = [], 0, 0
    for word in spec.replace("[", " [ ").replace("]", " ] ").split():
        if word in "[]":
            n, batch = n + 1, (n + 1 if word == "[" else 0)
            continue
        calls.append(Call(1 - rank, "isend" if word == "s" else "irecv", (3,), "float32",
                          ("cell", n, "f"), batch))
    return calls


@pytest.mark.parametrize("rank0, rank1, broken", [
    ("s r", "r s", None),
    ("r s", "r s", "both receive first"),
    ("s s r r", "r s r s", "both send first"),  # 1F1B with unbatched sends: stage 0, stage 1
    ("s [s r] r", "r [s r] s", None),  # Megatron's send_forward_recv_backward
    ("[r s]", "[r s]", None),  # one batch each: NCCL runs both calls together
    ("[r s]", "r s", None),
    ("s r", "r", "never matches"),
])
def test_pairs_play_out_as_under_nccl(rank0: str, rank1: str, broken: str | None) -> None:
    calls = [_calls(0, rank0), _calls(1, rank1)]
    if broken is None:
        check_pairs(calls)
    else:
        with pytest.raises(NcclRuleBroken, match=broken):
            check_pairs(calls)


def _cpu_tensor_on_a_gpu_rank() -> None:
    devices.device = lambda: torch.device("cuda", 0)  # this rank's device, as under NCCL
    dist.all_reduce(torch.ones(2))


def test_a_tensor_off_the_ranks_device_fails_at_the_call(rules) -> None:
    with pytest.raises(RankError) as info:
        run(_cpu_tensor_on_a_gpu_rank, 2)
    assert info.value.exc_type == "NcclRuleBroken"
    assert "all_reduce was given a tensor on cpu" in str(info.value)
    assert "device=parlab.launch.device()" in str(info.value)


def test_backend_from_the_gpus_and_the_environment(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("PARLAB_BACKEND", raising=False)
    monkeypatch.delenv("PARLAB_GPUS", raising=False)
    assert launch.pick_backend(4) == "cpu:gloo,cuda:nccl" and launch.pick_backend(8) == "gloo"
    monkeypatch.setenv("PARLAB_GPUS", "2,3")
    assert devices.gpus() == [2, 3]
    assert launch.pick_backend(2) == "cpu:gloo,cuda:nccl" and launch.pick_backend(3) == "gloo"
    monkeypatch.setenv("PARLAB_BACKEND", "gloo")
    assert launch.pick_backend(2) == "gloo"
    monkeypatch.setenv("PARLAB_BACKEND", "nccl")
    with pytest.raises(ValueError, match="needs 3 GPUs, this machine has 2 for you"):
        launch.pick_backend(3)
    monkeypatch.setenv("PARLAB_GPUS", "2,7")
    with pytest.raises(ValueError, match=r"names GPUs \[7\]; this machine has 4"):
        devices.gpus()
    monkeypatch.setenv("PARLAB_GPUS", "two")
    with pytest.raises(ValueError, match="PARLAB_GPUS=2,3"):
        devices.gpus()


def test_uses_nccl_reads_a_device_map(monkeypatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for backend, nccl in (("cpu:gloo,cuda:nccl", True), ("nccl", True), ("gloo", False)):
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        assert devices.uses_nccl() is nccl, backend


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU (what a rank under NCCL returns)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def cpu(self) -> torch.Tensor:  # type: ignore[override]
        return self.as_subclass(torch.Tensor).clone()


def test_results_come_back_on_the_cpu() -> None:
    x = torch.arange(4.0).as_subclass(_OnGpu)
    assert x.device.type == "cuda"
    back = pickle.loads(on_cpu({"out": [x, 3]}))
    y = back["out"][0]
    assert type(y) is torch.Tensor and y.device.type == "cpu" and y.tolist() == [0, 1, 2, 3]


def _answers(module: str) -> dict:
    """The solution notebook's answer cells (and what they use), run here as a kernel would."""
    import nbformat

    from parlab.grading.verify.source import learner_source
    from parlab.sandboxed.host import run_source

    nb = nbformat.read(ROOT / "solutions" / module / f"{module}.ipynb", as_version=4)
    return run_source(learner_source(nb))


def test_the_courses_rings_keep_ncclss_order(rules) -> None:
    """Module 00's ring all-reduce and module 05's ring attention, as the solutions write them,
    checked on 2 to 4 ranks with the rules on (2 ranks: left and right are one peer)."""
    from parlab.check import cp as cpcheck
    from parlab.check.collectives import check_ring_allreduce

    ring = _answers("00_collectives")["ring_allreduce"]
    cp = _answers("05_context_parallel")
    for w in (2, 3, 4):
        check_ring_allreduce(ring, world_size=w, quiet=True)
        cpcheck.check_ring_forward(cp["ring_attention"], world_size=w, quiet=True)
        cpcheck.check_ring_backward(cp["ring_attention_backward"], world_size=w, quiet=True)


def _numerics() -> tuple[bool, bool, str]:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


def test_ranks_compute_float32_in_full_precision() -> None:
    """TF32 off in every rank (cuDNN's default is on): a GPU rounds as the reference does."""
    assert run(_numerics, 2) == [(False, False, "highest")] * 2


def test_a_rank_on_a_gpu_blocks_in_ncclss_waits(monkeypatch) -> None:
    """Blocking waits make a NCCL deadlock look like gloo's to the hang diagnosis: the rank
    sits inside its call until the launcher's timeout (faked GPU: no CUDA needed)."""
    from parlab.launch import rank as rank_module

    placed: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", placed.append)
    monkeypatch.setattr(devices, "_placed", [None])  # this process is no rank: restored after
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k != "TORCH_NCCL_BLOCKING_WAIT"})  # a copy
    rank_module.take_gpu(None, nccl=True)
    assert placed == [] and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ
    rank_module.take_gpu(3, nccl=True)
    assert placed == [3], f"the rank's device was set to {placed}, not GPU 3"
    assert os.environ.get("TORCH_NCCL_BLOCKING_WAIT") == "1", "NCCL's waits do not block"
