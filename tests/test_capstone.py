"""Module 07 capstone: corpus, tiny GPT, and DP 2 × TP 2 training against one device.

The references are computed here, not taken from parlab: the corpus file is read and split
directly, the single-device step is a plain AdamW step on `GPT`, and the TP shards are put back
together by this file's own gather (qkv rows back from heads-first order). Losses are compared
with `parlab.capstone.TOLERANCE` (absolute); gradients and parameters after one step relative to
their largest entry, with the same number (the key bias left out: its gradient is zero but
for rounding, see `_without_key_bias`). Three real bugs must land above it: summing DP
gradients instead of averaging (seen in the gradients: AdamW divides by the gradient's own
size, so the loss curve hides it), no gradient sync, and every DP rank on the same rows.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import parlab
from parlab.capstone import TOLERANCE, check_plan, local_batch, train_parallel, train_single
from parlab.capstone import notebook as capstone_run
from parlab.capstone import train as capstone
from parlab.launch import run
from parlab.model import GPT, GPTConfig, batch, load_corpus

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
ROOT = Path(__file__).resolve().parents[1]
CFG = GPTConfig()
BATCH, LR, STEPS = 8, 3e-3, 8


# --- corpus and model ---------------------------------------------------------------------------
def test_corpus_is_the_shipped_text_split_into_words():
    words = (Path(parlab.__file__).parent / "model" / "data" / "corpus.txt").read_text().split()
    tokens, vocab = load_corpus()
    assert 200 <= len(vocab) <= 400 and vocab == sorted(set(words))
    assert [vocab[i] for i in tokens.tolist()] == words
    again, vocab_again = load_corpus()
    assert torch.equal(tokens, again) and vocab == vocab_again
    assert CFG.vocab >= len(vocab)


def test_batch_depends_only_on_step_and_seed():
    tokens, _ = load_corpus()
    x, y = batch(tokens, 3, batch_size=4, seq=16)
    torch.manual_seed(123)  # the global RNG plays no part
    x2, y2 = batch(tokens, 3, batch_size=4, seq=16)
    assert torch.equal(x, x2) and torch.equal(y, y2) and x.shape == y.shape == (4, 16)
    assert not torch.equal(x, batch(tokens, 4, batch_size=4, seq=16)[0])
    windows = tokens.unfold(0, 17, 1)  # (N - 16, 17): every window of the corpus
    for row_x, row_y in zip(x, y, strict=True):
        match = (windows[:, :-1] == row_x).all(1) & (windows[:, 1:] == row_y).all(1)
        assert match.any(), "a row is not a window of the corpus with its next words"


def test_gpt_is_seeded_causal_and_sized():
    torch.manual_seed(7)
    expected = torch.rand(1)
    torch.manual_seed(7)
    a, b = GPT(CFG), GPT(CFG)
    assert torch.equal(torch.rand(1), expected), "building a GPT must not move the global RNG"
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(GPT(GPTConfig(seed=1)).tok.weight, a.tok.weight)
    h, V, L, S = CFG.hidden, CFG.vocab, CFG.layers, CFG.seq
    assert sum(p.numel() for p in a.parameters()) == 2 * V * h + S * h + L * (12 * h * h +
                                                                             13 * h) + 2 * h
    x = torch.randint(0, V, (2, S))
    logits = a(x)
    assert logits.shape == (2, S, V)
    assert abs(a.loss(logits, x).item() - math.log(V)) < 0.2  # untrained: about uniform
    x2 = x.clone()
    x2[:, 10] = (x2[:, 10] + 1) % V
    assert torch.equal(a(x2)[:, :10], logits[:, :10]), "a later word changed an earlier logit"


def test_local_batches_cover_the_global_batch_once():
    x = torch.arange(24).view(8, 3)
    parts = [local_batch(x, x + 100, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), x + 100)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"dp": 2, "tp": 3, "batch_size": 8}, ["heads=4", "tp=3"]),
    ({"dp": 3, "tp": 1, "batch_size": 8}, ["batch_size=8", "dp=3", "multiple of 3"]),
    ({"dp": 2, "tp": 2, "batch_size": 8, "world_size": 3}, ["2 × 2 = 4", "3 ranks"]),
    ({"dp": 0, "tp": 2, "batch_size": 8}, ["dp=0", "positive"]),
])
def test_bad_sizes_say_what_to_change(kwargs, words):
    with pytest.raises(ValueError) as err:
        check_plan(CFG, **kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_bad_config_fails_before_any_rank_starts():
    with pytest.raises(ValueError, match="cfg.vocab=100 but the corpus has"):
        capstone_run.run_capstone(GPTConfig(vocab=100), 2)
    with pytest.raises(ValueError, match="not divisible by heads"):
        GPT(GPTConfig(hidden=30))
    with pytest.raises(ValueError, match="lr=0"):
        train_single(CFG, 1, batch_size=2, lr=0)


def test_plot_and_progress_lines(tmp_path):
    fig = capstone_run.plot_losses([5.0, 4.5, 4.0], [5.0, 4.5, 4.00001], tol=TOLERANCE)
    top, bottom = fig.axes
    assert top.get_title() and top.get_ylabel() and bottom.get_xlabel() == "step"
    assert top.get_legend() and len(bottom.get_lines()) == 2  # |difference| and tolerance
    with pytest.raises(ValueError, match="same number of steps"):
        capstone_run.plot_losses([1.0], [1.0, 2.0], tol=TOLERANCE)
    path = tmp_path / "progress.txt"
    path.write_text("0 5.5\n1 5.25\n2 5.")  # the last line is still being written
    rows, offset = capstone_run.read_progress(str(path))
    assert rows == [(0, 5.5), (1, 5.25)] and offset == len("0 5.5\n1 5.25\n")


# --- on 4 ranks ------------------------------------------------------------------------------
def _gather(model: torch.nn.Module, tp_group, what: str) -> dict[str, torch.Tensor]:
    """Every tensor (`what` = "data" or "grad") in the single-device model's layout."""
    full = dict(GPT(CFG).named_parameters())
    t, out = dist.get_world_size(tp_group), {}
    for name, p in model.named_parameters():
        mine = getattr(p, what).detach()
        dims = [d for d in range(mine.dim()) if mine.shape[d] != full[name].shape[d]]
        if dims:  # a TP shard: glue the t pieces back along the split dimension
            parts = [torch.empty_like(mine) for _ in range(t)]
            dist.all_gather(parts, mine.contiguous(), group=tp_group)
            mine = torch.cat(parts, dim=dims[0])
        if name.endswith(("qkv.weight", "qkv.bias")):  # [Q0; K0; V0; Q1; ...] -> [Q; K; V]
            mine = mine.reshape(t, 3, -1, *mine.shape[1:]).transpose(0, 1).reshape(mine.shape)
        out[name] = mine.cpu()
    return out


def _sum_gradients(model, dp_group) -> None:
    """Bug: all-reduce without dividing by dp."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)


def _no_sync(model, dp_group) -> None:
    """Bug: the gradient sync is forgotten; each DP replica follows its own rows."""


def _same_rows(x, y, dp_rank, dp):
    """Bug: every DP rank takes rank 0's rows (the dp_rank offset is forgotten)."""
    return local_batch(x, y, 0, dp)


def _one_step_worker() -> dict:
    tokens, _ = load_corpus()
    x, y = batch(tokens, 0, batch_size=BATCH, seq=CFG.seq)
    out = {}
    for label, sync in (("ok", capstone.sync_gradients), ("summed", _sum_gradients)):
        replica = capstone.setup_parallel(CFG, dp=2, tp=2, batch_size=BATCH, lr=LR)
        capstone.train_step(replica, x, y, sync_fn=sync)
        out[label] = {what: _gather(replica.model, replica.groups["tp"], what)
                      for what in ("data", "grad")}
    out["local_params"] = sum(p.numel() for p in replica.model.parameters())
    return out


def _single_step() -> dict:
    model = GPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = batch(load_corpus()[0], 0, batch_size=BATCH, seq=CFG.seq)
    F.cross_entropy(model(x).reshape(-1, CFG.vocab), y.reshape(-1)).backward()
    opt.step()
    return {"data": {n: p.detach() for n, p in model.named_parameters()},
            "grad": {n: p.grad for n, p in model.named_parameters()}}


def _without_key_bias(tensors: dict) -> dict:
    """The key bias cannot change any output (softmax ignores a constant added to a row of
    scores), so its gradient is rounding noise (~1e-10) and Adam's first step, g/(|g|+eps),
    turns that noise into moves of up to lr: different noise, different weights. Left out."""
    C = CFG.hidden
    return {n: torch.cat([t[:C], t[2 * C:]]) if n.endswith("qkv.bias") else t
            for n, t in tensors.items()}


def _worst(got: dict, ref: dict) -> float:
    """Largest difference, each tensor relative to its largest entry."""
    assert got.keys() == ref.keys()
    got, ref = _without_key_bias(got), _without_key_bias(ref)
    return max(((got[n] - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref)


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_one_step_gives_the_single_device_gradients_and_weights():
    ref = _single_step()
    key_bias = ref["grad"]["blocks.0.attn.qkv.bias"][CFG.hidden:2 * CFG.hidden]
    assert key_bias.abs().max() < 1e-6  # zero but for rounding, as _without_key_bias says
    full = sum(t.numel() for t in ref["data"].values())
    for rank, out in enumerate(run(_one_step_worker, 4, timeout=120)):
        assert out["local_params"] < full, "the blocks are not split over the TP group"
        for what in ("grad", "data"):
            assert _worst(out["ok"][what], ref[what]) < TOLERANCE, (rank, what)
        assert _worst(out["summed"]["grad"], ref["grad"]) > 100 * TOLERANCE  # 2x: ~1.0


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_dp2_tp2_follows_the_single_device_loss(monkeypatch):
    shown = []  # the progress bar, as a notebook kernel would display it
    monkeypatch.setattr(capstone_run, "_in_kernel", lambda: True)
    monkeypatch.setattr("IPython.display.display", shown.append)
    parallel = capstone_run.run_capstone(CFG, STEPS, dp=2, tp=2, batch_size=BATCH, lr=LR)
    single = train_single(CFG, STEPS, batch_size=BATCH, lr=LR)
    diffs = [abs(a - b) for a, b in zip(single, parallel, strict=True)]
    assert len(parallel) == STEPS and max(diffs) <= TOLERANCE, diffs
    assert single[-1] < single[0] - 0.3, "the model should learn something in a few steps"
    bar, label = shown[0].children
    assert bar.value == STEPS and bar.bar_style == "success" and f"{STEPS}/{STEPS}" in label.value


def _buggy_runs() -> dict[str, list[float]]:
    kw = {"dp": 2, "tp": 2, "batch_size": BATCH, "lr": LR}
    return {"no sync": train_parallel(CFG, STEPS, sync_fn=_no_sync, **kw),
            "same rows": train_parallel(CFG, STEPS, batch_fn=_same_rows, **kw)}


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_real_bugs_leave_the_tolerance():
    single = train_single(CFG, STEPS, batch_size=BATCH, lr=LR)
    for bug, losses in run(_buggy_runs, 4, timeout=120)[0].items():
        worst = max(abs(a - b) for a, b in zip(single, losses, strict=True))
        assert worst > 10 * TOLERANCE, f"{bug}: {worst:.1e}"


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_torchrun_script_checks_itself(torchrun):
    cmd = [*torchrun.cmd, "--standalone", "--nproc-per-node", "4", "scripts/capstone.py",
           "--dp", "2", "--tp", "2", "--steps", "3", "--check"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env=torchrun.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("loss ") == 3 and "OK" in proc.stdout, proc.stdout
