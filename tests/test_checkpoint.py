"""Checkpoints saved on one grid resume on others with the single-device losses.

Saved on 8 ranks as DP2 × PP2 × TP2 with SP after iteration 2 of 4, resumed as TP4 and as
DP4 with ZeRO-1 (4 ranks) and on 1 rank; saved on 4 ranks as DP2 × TP2 with ZeRO-1, resumed
on the same grid (every bit the same, the random state too) and as PP2 × TP2 with plain Adam.
Each resumed iteration is within TOLERANCE of the single device and of the run that never
stopped. Two planted bugs break it: a checkpoint without the optimizer state (the loss after
the first resumed step is off), a resumed run that restarts the data (off at once). A
vocabulary of 255 (padded to 256 rows for TP, split 128 + 127 real rows on TP2 and
64 + 64 + 64 + 63 on TP4) saved on DP2 × TP2 resumes as TP4 and on 1 rank.
Fast: ZeRO-1's flat slices <-> per-parameter chunks against the chunks computed here, on
3 ranks with sizes 3 does not divide; every rank's pieces tile every single-device tensor.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from parlab.compose import TOLERANCE, Plan, setup, train_single, train_step
from parlab.compose.checkpoint import save_state
from parlab.compose.resume import TRACKER, CheckpointParts, Checkpoints, iteration_dir
from parlab.compose.shards import chunk_rows, global_shapes, shard_specs
from parlab.compose.train import Position, train
from parlab.compose.zero_layout import from_chunks, to_chunks
from parlab.dp import ZeRO1
from parlab.launch import run
from parlab.model import LlamaConfig, load_corpus
from parlab.widgets import checkpoint_pieces, describe_checkpoint, plot_checkpoint

CFG = LlamaConfig(kv_heads=4)  # TP 4 needs 4 KV heads
PADDED = LlamaConfig(kv_heads=4, vocab=255)  # TP 2 and TP 4 pad it to 256 rows, differently
STEPS, SAVED, LR = 4, 2, 3e-3
SAVE8 = Plan(dp=2, pp=2, tp=2, sequence_parallel=True, micro_batch_size=2)
ZERO4 = Plan(dp=2, tp=2, micro_batch_size=2, distributed_optimizer=True)


def drop_optimizer(state: dict) -> dict:
    """Bug: a checkpoint without Adam's moments."""
    return {k: v for k, v in state.items() if not k.startswith("optim.")}


def restart_data(position: Position) -> Position:
    """Bug: the resumed run starts the data from the first batch again."""
    return dataclasses.replace(position, consumed_samples=0)


NO_BUGS = CheckpointParts()


def fit(plan: Plan, directory, *, load=None, step=None, parts=NO_BUGS,
        save_every=None, seed=None, cfg=CFG) -> dict:
    """Train `plan` to STEPS (resuming from `load` at `step`), saving every `save_every` to
    `directory`; the losses and, when seeded, the random numbers drawn after training."""
    if seed is not None:
        torch.manual_seed(seed + dist.get_rank())
        torch.rand(7)  # move the stream on: a restored state is not the default one
    ckpt = Checkpoints(save=directory, interval=save_every, load=load, step=step, parts=parts)
    losses = train(cfg, plan, STEPS, lr=LR, checkpoints=ckpt)
    resumed = ckpt.resumed.saved if ckpt.resumed else None
    return {"losses": losses, "rng": torch.rand(3), "resumed": resumed}


def save_without_optimizer(plan: Plan, directory) -> dict:
    """SAVED steps, then the buggy checkpoint (no optimizer state), then a resume from it."""
    rep = setup(CFG, plan, lr=LR)
    tokens, _ = load_corpus()
    for step in range(SAVED):
        train_step(rep, step, tokens)
    save_state(rep, iteration_dir(directory, SAVED), Position(SAVED, SAVED * 8),
               keep=drop_optimizer)
    if dist.get_rank() == 0:
        (directory / TRACKER).write_text(str(SAVED))
    dist.barrier()
    return fit(plan, None, load=directory)


def four_rank_jobs(tmp) -> dict:
    a, z, b, v = tmp / "dp2pp2tp2", tmp / "zero", tmp / "no_optimizer", tmp / "padded"
    out = {"ZeRO-1 DP2 x TP2, never stopped": fit(ZERO4, z, save_every=SAVED, seed=100),
           "V padded: DP2 x TP2": fit(Plan(dp=2, tp=2, micro_batch_size=2), v,
                                      save_every=SAVED, cfg=PADDED)}
    resumes = {
        "DP2 x PP2 x TP2 -> TP4": (Plan(tp=4, micro_batch_size=4), a, {}),
        "DP2 x PP2 x TP2 -> DP4 ZeRO-1": (Plan(dp=4, micro_batch_size=2,
                                               distributed_optimizer=True), a, {}),
        "ZeRO-1 DP2 x TP2 -> same grid": (ZERO4, z, {"seed": 5}),
        "ZeRO-1 DP2 x TP2 -> PP2 x TP2": (Plan(pp=2, tp=2, micro_batch_size=2), z, {}),
        "bug: data restarted": (ZERO4, z, {"parts": CheckpointParts(resume_at=restart_data)}),
        "V padded: DP2 x TP2 -> TP4": (Plan(tp=4, micro_batch_size=4), v, {"cfg": PADDED}),
    }
    for name, (plan, directory, extra) in resumes.items():
        out[name] = fit(plan, None, load=directory, step=SAVED, **extra)
    out["bug: optimizer not saved"] = save_without_optimizer(Plan(dp=2, tp=2,
                                                                  micro_batch_size=2), b)
    return out


def one_rank_jobs(tmp) -> dict:
    out = {"DP2 x PP2 x TP2 -> 1 rank": fit(Plan(micro_batch_size=8), None,
                                           load=tmp / "dp2pp2tp2", step=SAVED),
           "V padded: DP2 x TP2 -> 1 rank": fit(Plan(micro_batch_size=8), None,
                                                load=tmp / "padded", step=SAVED, cfg=PADDED)}
    try:  # another model: the message names what differs
        train(LlamaConfig(), Plan(micro_batch_size=8), STEPS, lr=LR,
              checkpoints=Checkpoints(load=tmp / "dp2pp2tp2"))
    except ValueError as exc:
        out["wrong model"] = str(exc)
    return out


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    eight = run(fit, 8, SAVE8, tmp / "dp2pp2tp2", save_every=SAVED, timeout=300)
    four = run(four_rank_jobs, 4, tmp, timeout=300)
    one = run(one_rank_jobs, 1, tmp, timeout=120)
    single = train_single(CFG, STEPS, global_batch_size=8, lr=LR)
    padded = train_single(PADDED, STEPS, global_batch_size=8, lr=LR)
    return eight, four, one, single, tmp, padded


PAIRS = {  # resumed run -> the run that never stopped
    "DP2 x PP2 x TP2 -> TP4": "DP2 x PP2 x TP2",
    "DP2 x PP2 x TP2 -> DP4 ZeRO-1": "DP2 x PP2 x TP2",
    "DP2 x PP2 x TP2 -> 1 rank": "DP2 x PP2 x TP2",
    "ZeRO-1 DP2 x TP2 -> same grid": "ZeRO-1 DP2 x TP2, never stopped",
    "ZeRO-1 DP2 x TP2 -> PP2 x TP2": "ZeRO-1 DP2 x TP2, never stopped",
    "V padded: DP2 x TP2 -> TP4": "V padded: DP2 x TP2",
    "V padded: DP2 x TP2 -> 1 rank": "V padded: DP2 x TP2",
}


def results(resumed) -> dict:
    eight, four, one, *_ = resumed
    assert all(r["losses"] == eight[0]["losses"] for r in eight), "ranks disagree"
    for name in four[0]:  # every rank reports the same losses
        assert all(r[name]["losses"] == four[0][name]["losses"] for r in four), name
    return {"DP2 x PP2 x TP2": eight[0], **four[0], **one[0]}


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("name", list(PAIRS))
def test_a_checkpoint_resumes_on_another_grid(resumed, name):
    got, single = results(resumed), resumed[5 if name.startswith("V padded") else 3]
    losses, never = got[name]["losses"], got[PAIRS[name]]["losses"]
    assert len(never) == STEPS and len(losses) == STEPS - SAVED, (name, losses)
    to_single = [abs(a - b) for a, b in zip(losses, single[SAVED:], strict=True)]
    to_never = [abs(a - b) for a, b in zip(losses, never[SAVED:], strict=True)]
    print(f"{name}: resumed iterations within {max(to_single):.1e} of one device, "
          f"{max(to_never):.1e} of the run that never stopped")
    assert max(to_single) <= TOLERANCE and max(to_never) <= TOLERANCE, (to_single, to_never)
    assert got[name]["resumed"].optimizer
    if name.endswith("same grid"):  # nothing changed: every bit, and each rank's stream
        assert losses == never[SAVED:], (losses, never)
        assert got[name]["resumed"].rng
        four = resumed[1]
        for r in four:
            assert torch.equal(r[name]["rng"], r[PAIRS[name]]["rng"]), "RNG not restored"


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_planted_bugs_break_the_resumed_losses(resumed):
    got, single = results(resumed), resumed[3]
    for name, first_wrong in (("bug: optimizer not saved", SAVED + 1),
                              ("bug: data restarted", SAVED)):
        gaps = [abs(a - b) for a, b in zip(got[name]["losses"], single[SAVED:], strict=True)]
        print(f"{name}: gaps {[f'{g:.1e}' for g in gaps]}")
        wrong = next(SAVED + i for i, g in enumerate(gaps) if g > 2 * TOLERANCE)
        assert wrong == first_wrong, (name, gaps)
    assert not got["bug: optimizer not saved"]["resumed"].optimizer


@pytest.mark.slow
def test_the_map_says_which_rank_wrote_which_piece(resumed):
    """parlab.widgets reads .metadata: on DP2 x PP2 x TP2 layer 0 lives on stage 0 (ranks 0,
    1, 4, 5 of the (dp, pp, tp) grid), wo's two column pieces are TP's; every tensor is
    covered exactly once; every rank wrote a file; the figure draws."""
    pieces = checkpoint_pieces(resumed[4] / "dp2pp2tp2" / "iter_0000002")
    wo = [p for p in pieces if p.key == "model.blocks.0.attn.wo.weight"]
    assert sorted(p.offsets for p in wo) == [(0, 0), (0, 16)], wo
    assert {p.sizes for p in wo} == {(32, 16)} and {p.rank for p in wo} <= {0, 1, 4, 5}
    down = [p for p in pieces if p.key == "model.blocks.3.mlp.down.weight"]
    assert {p.rank for p in down} <= {2, 3, 6, 7}, down
    for key in {p.key for p in pieces if p.shape}:
        mine = [p for p in pieces if p.key == key]
        assert sum(math.prod(p.sizes) for p in mine) == math.prod(mine[0].shape), key
    assert describe_checkpoint(pieces).count("distcp") == 8
    plot_checkpoint(pieces, ["model.tok.weight", "model.norm.weight"])


@pytest.mark.slow
def test_another_model_is_refused_by_name(resumed):
    message = resumed[2][0]["wrong model"]
    assert "another model" in message and "kv_heads=4 (this run: 2)" in message, message


# --- fast-ish: the pieces ------------------------------------------------------------------

SHAPES = [(5, 3), (7,), (2, 4), (4, 1, 3)]  # 42 numbers: slices of 14 on 3 ranks


def zero_round_trip() -> dict:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(s)) for s in SHAPES]
    zero = ZeRO1(params, group=None, lr=1e-3)
    whole = torch.arange(float(zero.padded))  # a flat state with every position's number
    whole[sum(p.numel() for p in params):] = 0  # ZeRO1 pads with zeros
    mine = whole[zero.rank * zero.shard:(zero.rank + 1) * zero.shard].clone()
    chunks = to_chunks(zero, mine)
    want, offset = [], 0
    for p in params:  # the chunk computed here: rows chunk_rows(...) of the unflattened state
        full = whole[offset:offset + p.numel()].view(p.shape)
        a, b = chunk_rows(p.shape[0], zero.d, zero.rank)
        want.append(full[a:b])
        offset += p.numel()
    return {"chunks": all(torch.equal(c, w) for c, w in zip(chunks, want, strict=True)),
            "back": torch.equal(from_chunks(zero, chunks), mine),
            "sizes": [c.shape[0] for c in chunks]}


@pytest.mark.usefixtures("no_orphans")
def test_zero1_slices_become_dim0_chunks_and_back():
    out = run(zero_round_trip, 3, timeout=60)
    assert all(r["chunks"] and r["back"] for r in out), out
    assert [r["sizes"] for r in out] == [[2, 3, 1, 2], [2, 3, 1, 2], [1, 1, 0, 0]]


def pieces(plan: Plan) -> list[tuple[str, tuple, tuple[int, ...]]]:
    """(name, local shape, offsets in the whole tensor) of this rank's parameters."""
    rep = setup(CFG, plan, lr=LR)
    out = []
    for s in shard_specs(rep):
        offset = [0] * len(s.shape)
        dim = s.tp_dim if s.tp_dim is not None else s.ep_dim
        if dim is not None:
            axis = "tp" if s.tp_dim is not None else "ep"
            offset[dim] = rep.grid.coords[axis] * s.param.shape[dim]
        out.append((s.name, tuple(s.param.shape), tuple(offset)))
    return out


@pytest.mark.usefixtures("no_orphans")
def test_every_rank_piece_tiles_the_single_device_tensors():
    plan = Plan(pp=2, tp=2, micro_batch_size=2)
    shapes = global_shapes(CFG)
    covered = {n: torch.zeros(s, dtype=torch.int) for n, s in shapes.items()}
    for rank in run(pieces, 4, plan, timeout=120):
        for name, shape, offset in rank:
            view = covered[name]
            for d, (o, n) in enumerate(zip(offset, shape, strict=True)):
                view = view.narrow(d, o, n)
            view += 1
    for name, count in covered.items():  # held by 1 or 2 ranks (the tied copy: 2 · 1)
        assert count.min() >= 1, f"{name}: some entries held by no rank"
        assert count.unique().numel() == 1, f"{name}: pieces overlap unevenly"
