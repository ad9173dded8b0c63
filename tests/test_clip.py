"""parlab.compose.clip_grad_norm_: the single device's gradient norm and clipping, on a grid.

Each grid takes step 0 of the composed training (`setup` at lr 0, `train_step`: the final
gradients, SP sums, tied embedding and DP mean done) and clips them with max_norm at half the
single-device norm, so the coefficient is well below 1. Compared, computed independently:
`torch.nn.utils.clip_grad_norm_` on the single-device `Llama` after the same step, its norm
(every rank must return it) and every rank's clipped gradient pieces against the single
device's clipped gradients at the piece's offsets. The grids, 2 to 8 ranks, each put a
different kind of copy in play: TP2 (RMSNorms whole on both TP ranks, the embedding split by
the vocabulary), PP2 (the tied embedding on both ends), CP2 (everything on both CP ranks),
EP2 × TP2 + SP with MoE (dense tensors on both ep ranks, experts split), DP2 × PP2 with an
untied head (the replicas; the head a tensor of its own on the last stage). The ∞-norm is
checked on TP2. A double-counting norm (every rank's squares added, each copy counted) must
fail the same comparison on every grid: the test can fail. One launch of 2 ranks and one of
4; the 8-rank DP2 × PP2 × TP2 + SP grid runs in module 08's hidden test and its table of
copies.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from test_compose import DENSE, MOE, UNTIED

from parlab.compose import Plan, clip_grad_norm_, setup, shard_specs, train_step
from parlab.launch import run
from parlab.model import Llama, LlamaConfig, batch, load_corpus

pytestmark = pytest.mark.usefixtures("no_orphans")
RTOL = 1e-5  # float32 sums in another order: ~1e-7 relative measured
TWO = [
    ("TP2", DENSE, Plan(tp=2, micro_batch_size=4)),
    ("TP2 inf-norm", DENSE, Plan(tp=2, micro_batch_size=4)),
    ("PP2", DENSE, Plan(pp=2, micro_batch_size=2)),
    ("CP2", DENSE, Plan(cp=2, layout="contiguous", micro_batch_size=4)),
]
FOUR = [
    ("MoE EP2 x TP2 SP", MOE, Plan(ep=2, tp=2, sequence_parallel=True, micro_batch_size=2)),
    ("DP2 x PP2 untied", UNTIED, Plan(dp=2, pp=2, micro_batch_size=2)),
]
JOBS = TWO + FOUR


@functools.lru_cache
def single(cfg: LlamaConfig, norm_type: float) -> tuple[float, dict[str, torch.Tensor]]:
    """torch.nn.utils.clip_grad_norm_ on the single device after step 0's whole batch, with
    max_norm at half the norm: (norm, clipped gradients by name)."""
    model = Llama(cfg)
    x, y = batch(load_corpus()[0], 0, batch_size=8, seq=cfg.seq, seed=cfg.seed)
    Llama.loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    norm = float(torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type))
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), norm / 2, norm_type=norm_type)
    return float(total), {n: p.grad.clone() for n, p in model.named_parameters()}


def counted_every_copy(specs: list) -> float:
    """The mistake: every rank adds the squares of all it holds; copies count once each."""
    local = sum(float(s.param.grad.double().pow(2).sum()) for s in specs)
    total = torch.tensor(local)
    dist.all_reduce(total)
    return float(total.sqrt())


def _piece(spec, grid) -> tuple[int, int]:
    """(dim, offset) of this rank's piece in the whole tensor; dim -1 when whole."""
    if spec.ep_dim is not None:
        n = spec.param.shape[spec.ep_dim]
        return spec.ep_dim, grid.coords["ep"] * n
    if spec.tp_dim is not None:
        n = spec.param.shape[spec.tp_dim]
        return spec.tp_dim, grid.coords["tp"] * n
    return -1, 0


def clip_jobs(jobs: list[tuple], max_norms: dict[str, float], inf_job: str) -> dict:
    """On every rank, per job: the double-counted norm, then clip_grad_norm_'s norm and the
    clipped pieces (name, dim, offset, grad)."""
    tokens, out = load_corpus()[0], {}
    for name, cfg, plan in jobs:
        rep = setup(cfg, plan, lr=0.0)  # lr 0: the step leaves the weights, keeps the grads
        train_step(rep, 0, tokens)
        specs = shard_specs(rep)
        wrong = counted_every_copy(specs)
        norm_type = float("inf") if name == inf_job else 2.0
        norm = clip_grad_norm_(specs, max_norms[name], rep.grid, norm_type=norm_type)
        pieces = [(s.name, *_piece(s, rep.grid),  # without a TP vocabulary's padding rows
                   s.param.grad.detach()[:getattr(s, "rows", None)].clone()) for s in specs]
        out[name] = {"norm": float(norm), "wrong": wrong, "pieces": pieces,
                     "is_tensor": isinstance(norm, torch.Tensor)}
    return out


INF = "TP2 inf-norm"


@pytest.fixture(scope="module")
def clipped():
    norms = {name: single(cfg, float("inf") if name == INF else 2.0)[0] / 2
             for name, cfg, _ in JOBS}
    results = {}
    for world, jobs in ((2, TWO), (4, FOUR)):
        ranks = run(clip_jobs, world, jobs, norms, INF, timeout=120)
        for name, *_ in jobs:
            results[name] = [r[name] for r in ranks]
    return results


@pytest.mark.parametrize("name", [job[0] for job in JOBS])
def test_the_grid_clips_as_one_device_does(clipped, name):
    cfg = next(job[1] for job in JOBS if job[0] == name)
    norm_type = float("inf") if name == INF else 2.0
    want, grads = single(cfg, norm_type)
    ranks = clipped[name]
    assert all(r["is_tensor"] for r in ranks)
    got = [r["norm"] for r in ranks]
    assert got == [got[0]] * len(got), (name, got)  # the same number on every rank
    assert got[0] == pytest.approx(want, rel=RTOL), (name, got[0], want)
    worst = 0.0
    for r in ranks:
        for full, dim, offset, g in r["pieces"]:
            ref = grads[full] if dim < 0 else grads[full].narrow(dim, offset, g.shape[dim])
            worst = max(worst, float((g - ref).abs().max() / grads[full].abs().max()))
    assert worst < 1e-4, (name, worst)  # as test_compose's GRAD_TOL: step 0's rounding


@pytest.mark.parametrize("name", [job[0] for job in JOBS if job[0] != INF])
def test_a_norm_that_counts_copies_fails_the_comparison(clipped, name):
    cfg = next(job[1] for job in JOBS if job[0] == name)
    want = single(cfg, 2.0)[0]
    wrong = clipped[name][0]["wrong"]
    # 5 RTOL at least: on TP2 the only copies are the RMSNorms (the embedding is split by the
    # vocabulary), whose squares are ~1.6e-4 of the total: the norm 7.8e-5 too large
    assert wrong > want * (1 + 5 * RTOL), (name, wrong, want)
