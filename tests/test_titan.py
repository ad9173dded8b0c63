"""parlab.compose.titan: module 08's Llama built with PyTorch's own API (DeviceMesh, TP + SP
plans, fully_shard, pipelining) follows the single-device losses and gradients, and the
course's composed model (`parlab.compose.train`) step for step.

Fast: the torchtitan-style model computes the single-device Llama's logits; names map both
ways; plans it cannot run say why. Slow: two 4-rank grids (DP2 × PP2 with FSDP2 and 1F1B;
DP2 × TP2 + SP, FSDP2 over DTensor TP weights) against one device and the composed model,
and a planted bug (FSDP dropped: no gradient reduction over dp) caught at step 0; FSDP2's
state per rank half the composed model's; DTensor's collectives counted as torch's
CommDebugMode counts them, an all-gather priced (t-1)/t of its output.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from parlab.comm.dispatch import functional_trace
from parlab.compose import TOLERANCE, Plan, train_single
from parlab.compose.titan import (
    TitanLlama,
    check_titan_plan,
    full_grads,
    parallelize_llama,
    setup_titan,
    single_name,
    split_stage,
    titan_names,
    titan_step,
)
from parlab.compose.titan.compare import build
from parlab.compose.titan.traffic import state_bytes
from parlab.compose.titan.train import micro_loss, step_context
from parlab.launch import device, run
from parlab.model import Llama, LlamaConfig, batch, load_corpus

STEPS, LR = 3, 3e-3
GRAD_TOL = 1e-4  # step 0's gradients, relative to each tensor's largest entry (as test_compose)
DENSE = LlamaConfig()


# --- fast ------------------------------------------------------------------------------------

def test_the_titan_layout_computes_the_single_device_logits():
    x, _ = batch(load_corpus()[0], 0, batch_size=2, seq=DENSE.seq, seed=DENSE.seed)
    want = Llama(DENSE)(x)
    assert torch.allclose(TitanLlama(DENSE)(x), want, atol=1e-5)
    stages = [[0, 1], [2, 3]]
    first, last = (split_stage(TitanLlama(DENSE), s, stages) for s in (0, 1))
    assert last.tok_embeddings is None and first.output is None
    assert torch.allclose(last(first(x)), want, atol=1e-5)


def test_every_name_maps_both_ways():
    for tied in (True, False):
        cfg = dataclasses.replace(DENSE, tied=tied)
        single = {n for n, _ in Llama(cfg).named_parameters()}
        titan = [n for n, _ in TitanLlama(cfg).named_parameters()]
        assert {single_name(n, tied=tied) for n in titan} == single
        assert sorted(t for n in single for t in titan_names(n, tied=tied)) == sorted(titan)
    with pytest.raises(KeyError, match="no parameter"):
        single_name("layers.0.mlp.gate.weight", tied=True)


@pytest.mark.parametrize("plan, words", [
    (Plan(tp=2), "TP \\+ SP"),
    (Plan(cp=2), "DP × PP × TP"),
    (Plan(pp=2, virtual=2, schedule="interleaved_1f1b"), "DP × PP × TP"),
    (Plan(pp=2, schedule="zb_h1"), "runs one"),
])
def test_plans_it_cannot_run_say_why(plan, words):
    with pytest.raises(ValueError, match=words):
        check_titan_plan(DENSE, plan)


# --- slow: two grids against one device and the composed model ---------------------------------

def without_fsdp(part, mesh, plan):
    """Bug: no fully_shard, so no gradient reduction over dp (each replica steps on its rows)."""
    return parallelize_llama(part, mesh, dataclasses.replace(plan, dp=1))


GRIDS = [  # name, plan, parallelize
    ("DP2 x PP2", Plan(dp=2, pp=2, micro_batch_size=2), parallelize_llama),
    ("DP2 x TP2 SP", Plan(dp=2, tp=2, sequence_parallel=True, micro_batch_size=2),
     parallelize_llama),
    ("DP2 x PP2 without FSDP", Plan(dp=2, pp=2, micro_batch_size=2), without_fsdp),
]


def _local_numel(rep) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel()
               for p in rep.part.parameters())


def run_grids(jobs) -> dict[str, dict]:
    tokens, _ = load_corpus()
    out = {}
    for name, plan, parallelize in jobs:
        rep = setup_titan(DENSE, plan, lr=LR, parallelize=parallelize)
        losses = [titan_step(rep, 0, tokens)]
        grads = full_grads(rep)
        losses += [titan_step(rep, step, tokens) for step in range(1, STEPS)]
        out[name] = {"losses": losses, "grads": grads, "local": _local_numel(rep),
                     "state": sum(state_bytes(rep.part.parameters(), rep.optimizer).values())}
        if parallelize is parallelize_llama:
            step, held = build("composed", DENSE, plan, lr=LR)
            out[name]["composed"] = [step(i) for i in range(STEPS)]
            out[name]["composed state"] = sum(state_bytes(*held).values())
    out["counts"] = funcol_counts(tokens)
    out["gather"] = gather_bytes()
    return out


def funcol_counts(tokens) -> tuple[dict[str, int], dict[str, int]]:
    """DTensor's collectives in one forward and backward on DP2 × TP2 + SP, counted by torch's
    CommDebugMode and by parlab.comm.dispatch.functional_trace (CommDebugMode fails inside a
    pipelining schedule, so the stage's module is called directly)."""
    from torch.distributed.tensor.debug import CommDebugMode

    rep = setup_titan(DENSE, GRIDS[1][1], lr=LR)
    x, y = batch(tokens, 0, batch_size=4, seq=DENSE.seq, seed=DENSE.seed)
    with CommDebugMode() as torch_count, functional_trace() as ours, step_context(rep):
        micro_loss(rep.part(x), y).backward()
    theirs = {str(k).split(".")[-1]: v for k, v in torch_count.get_comm_counts().items()
              if str(k).startswith("c10d_functional.")}
    mine: dict[str, int] = {}
    for event in ours.events:
        mine[event.kind] = mine.get(event.kind, 0) + 1
    return theirs, mine


def gather_bytes() -> float:
    """A (4, 8) float32 DTensor Shard(0) over 4 ranks made Replicate: one all-gather."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(device().type, (4,))
    x = distribute_tensor(torch.ones(4, 8, device=device()), mesh, [Shard(0)])
    with functional_trace() as ours:
        x.redistribute(mesh, [Replicate()]).to_local()
    return ours.wire_bytes()


@functools.lru_cache
def single_grads() -> dict[str, torch.Tensor]:
    model = Llama(DENSE)
    x, y = batch(load_corpus()[0], 0, batch_size=8, seq=DENSE.seq, seed=DENSE.seed)
    Llama.loss(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def grad_error(results: list[dict], name: str) -> float:
    ref, worst, seen = single_grads(), 0.0, set()
    for r in results:
        for full, g in r[name]["grads"].items():
            worst = max(worst, float((g - ref[full]).abs().max() / ref[full].abs().max()))
            seen.add(full)
    assert seen == set(ref), f"{name}: no stage holds {sorted(set(ref) - seen)}"
    return worst


@pytest.fixture(scope="module")
def grids():
    results = run(run_grids, 4, GRIDS, timeout=180)
    single = train_single(DENSE, STEPS, global_batch_size=8, lr=LR)
    return results, single


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("name", [g[0] for g in GRIDS[:2]])
def test_torch_api_grid_follows_one_device_and_the_composed_model(grids, name):
    results, single = grids
    losses = results[0][name]["losses"]
    assert all(r[name]["losses"] == losses for r in results), f"{name}: ranks disagree"
    gaps = [abs(a - b) for a, b in zip(losses, single, strict=True)]
    composed = [abs(a - b) for a, b in zip(losses, results[0][name]["composed"], strict=True)]
    print(f"{name}: one device {max(gaps):.1e}, composed {max(composed):.1e}")
    assert max(gaps) <= TOLERANCE and max(composed) <= TOLERANCE, (name, gaps, composed)
    assert grad_error(results, name) < GRAD_TOL
    full = sum(p.numel() for p in TitanLlama(DENSE).parameters())
    assert all(r[name]["local"] <= full // 2 for r in results), "weights copied, not sharded"
    # FSDP2 shards weights, gradients and Adam's moments over dp = 2 (every dim here is even:
    # no padding), the composed model's DDP keeps them whole: half. Without a pipeline the
    # torch-API model also holds the tied head's own copy (V, C)/t, four times (weight, grad,
    # two moments) over dp; the composed one uses the embedding's matrix for both
    plan = dict((g[0], g[1]) for g in GRIDS)[name]
    copy = 0 if plan.pp > 1 else 4 * 4 * DENSE.vocab * DENSE.hidden // (plan.tp * plan.dp)
    assert [r[name]["state"] for r in results] == [
        r[name]["composed state"] // 2 + copy for r in results]


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_dtensor_collectives_are_counted_as_torch_counts_them(grids):
    results, _ = grids
    theirs, mine = results[0]["counts"]
    assert mine == theirs and mine.get("all_gather_into_tensor")
    full = 4 * 8 * 4  # bytes of the gathered (4, 8) float32
    assert all(r["gather"] == 3 / 4 * full for r in results)  # (t-1)/t of the output


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_dropping_the_dp_reduction_is_caught_at_step_0(grids):
    results, single = grids
    name = GRIDS[2][0]
    assert grad_error(results, name) > 10 * GRAD_TOL  # each replica's own rows' gradient
    assert abs(results[0][name]["losses"][1] - single[1]) > TOLERANCE
