"""parlab.compose: the Llama trained on a grid follows the single-device losses at every step.

Fast: the stage split against a brute force, the cost model against PyTorch's FLOP counter,
plans that cannot run, a rank's tokens and rows. Slow: 1 rank and every axis alone at 2
(DP, PP with 1F1B / interleaved / ZB-H1 / an untied head, TP, TP+SP, TP with an untied head
and a vocabulary of 255 padded to 256, CP, EP on the MoE variant), each loss within
TOLERANCE of `train_single` and every shard of step 0's gradients within GRAD_TOL of the
single device's (Adam hides a gradient off by a constant factor from the losses: a sum
instead of a mean, a missing 1/ep; a padded vocabulary's extra rows must get none), and three
planted bugs caught at their first wrong step.
Grids of 4 and 8 ranks: tests/test_compose_grids.py.
"""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from parlab.compose import (
    TOLERANCE,
    Grid,
    Parts,
    Plan,
    Replica,
    check_plan,
    layer_costs,
    setup,
    split_layers,
    train_single,
    train_step,
)
from parlab.launch import run
from parlab.mesh import make_mesh
from parlab.model import Llama, LlamaConfig, batch, load_corpus

STEPS, LR = 4, 3e-3
GRAD_TOL = 1e-4  # step 0's gradients, relative to each tensor's largest entry: ~1e-6 is rounding
DENSE = LlamaConfig()
MOE = LlamaConfig(moe_layers=(1, 3), capacity_factor=1.0)  # capacity 8 of 16·2/4: it binds
UNTIED = LlamaConfig(tied=False)
PADDED = LlamaConfig(tied=False, vocab=255)  # TP 2 pads the vocabulary to 256 rows
FULL = {cfg: sum(p.numel() for p in Llama(cfg).parameters())
        for cfg in (DENSE, MOE, UNTIED, PADDED)}


def shard_grads(rep: Replica) -> list[tuple[str, int, int, torch.Tensor]]:
    """This rank's gradients, each with the full model's name and where it sits in it:
    (name, dim, offset, grad); dim -1 for a whole tensor. Names are the single device's."""
    full = dict(Llama(rep.cfg).named_parameters())
    p, r, t = rep.grid.size("pp"), rep.grid.coords["pp"], rep.grid.coords["tp"]
    layers = rep.parts.split_layers(rep.cfg, rep.plan.pp * rep.plan.virtual)
    out = []
    for c, stage in enumerate(rep.model.stages):
        named = [("tok.weight", stage.tok.weight)] if stage.tok is not None else []
        named += [("norm.weight", stage.norm.weight)] if stage.norm is not None else []
        if stage.head is not None:  # its own matrix, or the tied embedding's copy
            named.append(("tok.weight" if rep.cfg.tied else "head.weight", stage.head))
        for k, block in enumerate(stage.blocks):
            i = layers[c * p + r][k]
            named += [(f"blocks.{i}.{n}", q) for n, q in block.named_parameters()]
        for name, q in named:
            shape, dim, offset = full[name].shape, -1, 0
            if shape != q.shape:
                dim = next(d for d in range(q.dim()) if q.shape[d] != shape[d])
                expert = ".mlp." in name and q.dim() == 3  # (E_l, F, C): this rank's experts
                offset = rep.grid.coords["ep"] * q.shape[0] if expert else t * q.shape[dim]
            assert q.grad is not None, name
            out.append((name, dim, offset, q.grad.detach().clone()))
    return out


def run_jobs(jobs: list[tuple]) -> dict[str, dict]:
    """On every rank: train each (name, cfg, plan[, parts]); its losses, its number of
    parameters, and its gradients of step 0 (`shard_grads`)."""
    tokens, _ = load_corpus()
    out = {}
    for name, cfg, plan, *parts in jobs:
        rep = setup(cfg, plan, lr=LR, parts=parts[0] if parts else Parts())
        losses = [train_step(rep, 0, tokens)]
        grads = shard_grads(rep)  # after step 0's sync (the optimizer leaves .grad alone)
        losses += [train_step(rep, step, tokens) for step in range(1, STEPS)]
        out[name] = {"losses": losses, "grads": grads,
                     "params": sum(p.numel() for p in rep.model.unique_parameters())}
    return out


def gaps_to_single(results: list[dict], jobs: list[tuple]) -> dict[str, list[float]]:
    """|parallel - single-device| per step for each job, after checking every rank agrees."""
    single = {cfg: train_single(cfg, STEPS, global_batch_size=8, lr=LR)
              for cfg in {job[1] for job in jobs}}
    gaps = {}
    for name, cfg, *_ in jobs:
        losses = results[0][name]["losses"]
        assert all(r[name]["losses"] == losses for r in results), f"{name}: ranks disagree"
        gaps[name] = [abs(a - b) for a, b in zip(losses, single[cfg], strict=True)]
        print(f"{name}: largest gap {max(gaps[name]):.1e}")
    return gaps


@functools.lru_cache
def single_grads(cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """The single-device gradients of step 0's whole batch."""
    model = Llama(cfg)
    x, y = batch(load_corpus()[0], 0, batch_size=8, seq=cfg.seq, seed=cfg.seed)
    Llama.loss(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def worst_grad_error(results: list[dict], name: str, cfg: LlamaConfig) -> float:
    """Largest |parallel - single| over every rank's gradient shards, each relative to the
    largest entry of its full single-device gradient."""
    ref, worst = single_grads(cfg), 0.0
    for r in results:
        for full, dim, offset, g in r[name]["grads"]:
            if dim >= 0:  # a padded vocabulary's rows past V: their gradient must be zero
                real = max(0, min(g.shape[dim], ref[full].shape[dim] - offset))
                assert not g.narrow(dim, real, g.shape[dim] - real).any(), (name, full)
                g = g.narrow(dim, 0, real)
            want = ref[full] if dim < 0 else ref[full].narrow(dim, offset, g.shape[dim])
            worst = max(worst, float((g - want).abs().max() / ref[full].abs().max()))
    return worst


def first_wrong_step(gaps: list[float]) -> int | None:
    return next((i for i, g in enumerate(gaps) if g > TOLERANCE), None)


# --- fast ------------------------------------------------------------------------------------

def test_split_layers_minimises_the_slowest_stage():
    cfg = LlamaConfig(layers=6, moe_layers=(0, 1))
    costs = layer_costs(cfg)
    for n in (2, 3):
        split = split_layers(cfg, n)
        assert [i for s in split for i in s] == list(range(6)) and all(split)
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, 6), strict=True))
                   for cuts in itertools.combinations(range(1, 6), n - 1))
        assert max(sum(costs[i] for i in s) for s in split) == best
    assert split_layers(DENSE, 2) == [[0, 1], [2, 3]]  # equal layers, light head: equal


def test_layer_costs_count_what_pytorch_counts():
    model = Llama(DENSE)
    B, T, H, D = 2, DENSE.seq, DENSE.heads, DENSE.hidden // DENSE.heads
    with FlopCounterMode(display=False) as counter:
        model.blocks[0](torch.randn(B, T, DENSE.hidden))  # the projections and the MLP
        q = torch.randn(B, H, T, D)  # CPU's fused attention kernel is not counted: its
        torch.matmul(torch.matmul(q, q.transpose(-2, -1)), q)  # two matmuls, by hand
    per_token = counter.get_total_flops() / (B * T)
    assert layer_costs(DENSE)[0] == pytest.approx(per_token, rel=0.01)
    assert layer_costs(DENSE)[-1] - layer_costs(DENSE)[0] == 2 * DENSE.hidden * DENSE.vocab


@pytest.mark.parametrize("plan, cfg, words", [
    (Plan(tp=4), DENSE, "kv_heads"),
    (Plan(ep=3), MOE, "experts"),
    (Plan(tp=2, ep=2), MOE, "sequence parallelism"),
    (Plan(cp=3), DENSE, "CP"),
    (Plan(dp=3), DENSE, "global batch"),
    (Plan(pp=2, virtual=2), DENSE, "interleaved"),
    (Plan(pp=8), DENSE, "stages"),
])
def test_plans_that_cannot_run_say_why(plan, cfg, words):
    with pytest.raises(ValueError, match=words):
        check_plan(cfg, plan)


def test_a_rank_holds_its_positions_and_rows():
    mesh = make_mesh(8, dp=2, cp=2, tp=2)
    rank = int(mesh.grid[1, 0, 0, 1, 1])  # dp 1, cp 1, tp 1
    grid = Grid(mesh, rank, mesh.coords(rank), {}, "zigzag")
    pos = grid.positions(16, sequence_parallel=True)
    assert pos.cp.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # zigzag chunks 1 and 2 of 4
    assert pos.sp.tolist() == [8, 9, 10, 11]  # the second half of them (tp 1)
    assert pos.table.shape == (2, 8)
    assert grid.batch_rows(8) == slice(4, 8)
    rows = [Grid(mesh, r, mesh.coords(r), {}).batch_rows(8) for r in range(8)]
    assert sorted({(s.start, s.stop) for s in rows}) == [(0, 4), (4, 8)]


# --- slow: every axis alone ------------------------------------------------------------------

ONE = [("1x1x1", DENSE, Plan(micro_batch_size=2))]
TWO = [
    ("DP2", DENSE, Plan(dp=2, micro_batch_size=2)),
    ("PP2 1F1B", DENSE, Plan(pp=2, micro_batch_size=2)),
    ("PP2 interleaved v2", DENSE, Plan(pp=2, virtual=2, schedule="interleaved_1f1b",
                                       micro_batch_size=2)),
    ("PP2 ZB-H1", DENSE, Plan(pp=2, schedule="zb_h1", micro_batch_size=2)),
    ("PP2 untied head", UNTIED, Plan(pp=2, micro_batch_size=2)),
    ("TP2", DENSE, Plan(tp=2, micro_batch_size=4)),
    ("TP2 SP", DENSE, Plan(tp=2, sequence_parallel=True, micro_batch_size=4)),
    ("TP2 untied head, V padded", PADDED, Plan(tp=2, micro_batch_size=4)),
    ("CP2", DENSE, Plan(cp=2, layout="contiguous", micro_batch_size=4)),
    ("EP2 MoE", MOE, Plan(ep=2, micro_batch_size=2)),
]


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("name", [job[0] for job in ONE + TWO])
def test_each_axis_alone_follows_the_single_device_loss(alone, name):
    results, gaps = alone
    assert max(gaps[name]) <= TOLERANCE, (name, gaps[name])
    cfg = next(job[1] for job in ONE + TWO if job[0] == name)
    error = worst_grad_error(results, name, cfg)
    print(f"{name}: step 0 gradients within {error:.1e} of one device")
    assert error < GRAD_TOL, (name, error)
    local = [r[name]["params"] for r in results]
    if name.startswith(("TP", "PP", "EP")):  # the weights are split, not copied
        assert max(local) < FULL[cfg], (name, local, FULL[cfg])
    else:
        assert local == [FULL[cfg]] * len(local)


# --- slow: planted bugs ------------------------------------------------------------------------

def skip_sync(params, *, group) -> None:
    """Bug: a gradient sync that does nothing."""


def reversed_stages(cfg: LlamaConfig, n_stages: int) -> list[list[int]]:
    """Bug: the stages' layers in the wrong order (stage 0 runs the last layers)."""
    return split_layers(cfg, n_stages)[::-1]


BUGS = [  # name, cfg, plan, parts, the first step whose loss must be wrong
    ("no DP sync", DENSE, Plan(dp=2, micro_batch_size=2), Parts(sync_data_parallel=skip_sync), 1),
    ("wrong stage order", DENSE, Plan(pp=2, micro_batch_size=2),
     Parts(split_layers=reversed_stages), 0),
    ("SP without the RMSNorm-gradient sum", DENSE,
     Plan(tp=2, sequence_parallel=True, micro_batch_size=4),
     Parts(sync_sequence_parallel=skip_sync), 1),
]


@pytest.fixture(scope="module")
def alone():
    """One launch of 1 rank and one of 2 for every grid above and every planted bug."""
    bugs = [bug[:4] for bug in BUGS]
    one = run(run_jobs, 1, ONE, timeout=120)
    two = run(run_jobs, 2, TWO + bugs, timeout=300)
    results = [{**one[0], **r} for r in two]
    return results, gaps_to_single(results, ONE + TWO + bugs)


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_planted_bugs_break_the_match_at_their_first_wrong_step(alone):
    _, gaps = alone
    for name, *_, first in BUGS:
        assert first_wrong_step(gaps[name]) == first, (name, gaps[name])
        assert gaps[name][first] > 2 * TOLERANCE, (name, gaps[name])
