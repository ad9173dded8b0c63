"""PyTorch's FSDP2 (`fully_shard`) beside the course's FSDP layer (module 01's "The same in
PyTorch"): what the tracer sees of it, which rows each rank holds, and its bytes per step.

Expected values are written out here from FSDP2's documented rule (each parameter split
along dim 0 with torch.chunk: ceil(rows/t) rows a rank, the last ranks fewer or none, each
shard padded to ceil(rows/t) rows for the all-gather), never read from parlab's output.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from parlab import comm
from parlab.launch import run


def _keyword_calls() -> list[tuple[str, int, float]]:
    t = dist.get_world_size()
    full, shard = torch.ones(12 * t), torch.empty(12)
    with comm.trace() as tr:
        dist.all_gather_single(output_tensor=full, input_tensor=torch.ones(12))
        dist.reduce_scatter_single(output=shard, input=full)  # as FSDP2 calls it
        dist.reduce_scatter_tensor(output=shard, input=full)
    return [(e.kind, e.nbytes, e.wire_bytes) for e in tr.events]


@pytest.mark.parametrize("t", [2, 3])
def test_the_tracer_counts_calls_made_with_keyword_arguments(t: int) -> None:
    n = 12 * t * 4  # bytes of the full tensor: t shards of 12 float32
    want = (t - 1) / t * n
    for events in run(_keyword_calls, t):
        assert events == [("all_gather_single", n, pytest.approx(want)),
                          ("reduce_scatter_single", n, pytest.approx(want)),
                          ("reduce_scatter_tensor", n, pytest.approx(want))]


WIDTHS = (8, 6, 5, 4)  # three layers: Linear(8, 6), Linear(6, 5), Linear(5, 4)
PLAN = (True, False, True)  # reshard_after_forward per layer


def _stack() -> torch.nn.Sequential:
    torch.manual_seed(3)
    layers: list[torch.nn.Module] = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:], strict=True):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + rank)
    return torch.randn(3, WIDTHS[0], generator=g), torch.randn(3, WIDTHS[-1], generator=g)


def _fsdp2_step(plan: tuple[bool, ...]) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from parlab.dp import measure_step, shard_stack
    from parlab.launch import device

    t, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(device().type, (t,), mesh_dim_names=("dp",))
    model = shard_stack(_stack().to(device()), mesh, plan)
    local = {n: (str(p.placements), p.to_local().detach().clone(),
                 p.to_local().untyped_storage().nbytes()) for n, p in model.named_parameters()}
    x, up = (v.to(device()) for v in _inputs(rank))
    kept: list[bool] = []
    hook = model.register_forward_hook(lambda *_: kept.extend(
        not isinstance(m.weight, DTensor) for m in model if isinstance(m, torch.nn.Linear)))
    step = measure_step(model, x, up)
    hook.remove()
    grads = {n: p.grad.to_local().clone() for n, p in model.named_parameters()}
    return {"local": local, "step": step, "kept": kept, "grads": grads}


@pytest.mark.parametrize("t", [2, 3])
def test_fully_shard_holds_the_rows_torch_chunk_gives_padded_and_moves_the_bytes_of_the_model(
        t: int) -> None:
    """Linear(8, 6), Linear(6, 5), Linear(5, 4) on 3 ranks: rows 2,2,2 / 2,2,1 / 2,2,0, each
    shard's storage padded to ceil(R/t) rows; gradients the DDP mean; bytes as step_bytes."""
    from parlab.dp import dim0_rows, step_bytes

    results = run(_fsdp2_step, t, PLAN)
    ref = _stack()
    xs = [_inputs(r) for r in range(t)]
    (sum((ref(x) * u).sum() for x, u in xs) / t).backward()
    for rank, res in enumerate(results):
        for name, p in ref.named_parameters():
            placement, shard, storage = res["local"][name]
            c = -(-p.shape[0] // t)  # ceil: rows of every padded shard
            start, end = min(rank * c, p.shape[0]), min((rank + 1) * c, p.shape[0])
            assert placement == "(Shard(dim=0),)" and torch.equal(shard, p.detach()[start:end])
            assert dim0_rows(p.shape[0], t)[rank] == (start, end)
            assert storage == c * p[0].numel() * 4, (name, rank, storage)
            torch.testing.assert_close(res["grads"][name], p.grad[start:end])
        assert res["kept"] == [not r for r in PLAN]
        units = [[tuple(m.weight.shape), tuple(m.bias.shape)] for m in ref
                 if isinstance(m, torch.nn.Linear)]
        model = step_bytes(units, t, PLAN)
        step = res["step"]
        assert [k for k, _, _ in step.forward] == ["all_gather"] * 3
        assert sorted(k for k, _, _ in step.backward) == ["all_gather"] * 2 + ["reduce_scatter"] * 3
        assert sum(w for k, _, w in step.backward if k == "reduce_scatter") == \
            pytest.approx(model["reduce-scatter"])
        assert step.wire_bytes == pytest.approx(model["total"])


def _turn_bytes(kind: str, keep: bool) -> int:
    from torch.distributed.device_mesh import init_device_mesh

    from parlab.dp import FSDPLinear, measure_step, shard_stack
    from parlab.launch import device

    t = dist.get_world_size()
    flags = [not keep] * 3
    stack = _stack().to(device())
    if kind == "fsdp2":
        mesh = init_device_mesh(device().type, (t,), mesh_dim_names=("dp",))
        model = shard_stack(stack, mesh, flags)
    else:
        model = torch.nn.Sequential(*[
            FSDPLinear.from_linear(m, reshard_after_forward=not keep)
            if isinstance(m, torch.nn.Linear) else m for m in stack])
    step = measure_step(model, *(x.to(device()) for x in _inputs(dist.get_rank())))
    return step.turn - step.before


def test_measure_step_sees_the_weights_kept_from_forward_to_backward() -> None:
    """Keeping every layer resident holds its gathered weights between forward and backward,
    padding included: FSDP2's gathered tensor is the all-gather's output, each parameter
    padded to 2 ceil(R/2) rows (Linear(6, 5): 6 rows of 6 + 6, not 5 of 6 + 5); the course's
    layer keeps the flat vector padded to 2 ceil(P/2) elements (35 -> 36)."""
    layers = list(zip(WIDTHS[:-1], WIDTHS[1:], strict=True))  # (in, out)
    fsdp2 = 4 * sum(2 * -(-out // 2) * (in_ + 1) for in_, out in layers)
    course = 4 * sum(2 * -(-(out * (in_ + 1)) // 2) for in_, out in layers)
    assert (fsdp2, course) == (480, 456)  # 4 * (54 + 42 + 24), 4 * (54 + 36 + 24)
    for kind, want in (("fsdp2", fsdp2), ("course", course)):
        kept, freed = (run(_turn_bytes, 2, kind, keep)[0] for keep in (True, False))
        assert kept - freed == want, (kind, kept, freed)


def test_owners_follow_each_layout() -> None:
    """owners_flat against the course's take_shard of [vec W; b] = arange(P); owners_dim0
    against torch.chunk of W's rows."""
    from parlab.dp import owners_dim0, owners_flat, take_shard

    for out_f, in_f, t in ((8, 8, 2), (8, 8, 3), (6, 5, 4)):
        p = out_f * (in_f + 1)
        owner = torch.full((p,), -1)
        for r in range(t):
            owner[take_shard(torch.arange(p), r, t)[take_shard(torch.arange(p), r, t) < p]] = r
        flat = owners_flat(out_f, in_f, t)
        assert torch.equal(torch.cat([flat[:, :in_f].flatten(), flat[:, in_f]]), owner)
        rows = torch.cat([torch.full((len(c),), r) for r, c in
                          enumerate(torch.arange(out_f).chunk(t))])
        assert torch.equal(owners_dim0(out_f, in_f, t), rows[:, None].expand(-1, in_f + 1))


def test_the_figures_draw_what_they_say() -> None:
    """plot_shard_owners shows each layout's owners (the grids the tests above checked);
    plot_step_bytes stacks the three parts of each row to its measured total."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parlab.dp import owners_dim0, owners_flat
    from parlab.widgets import plot_shard_owners, plot_step_bytes

    fig = plot_shard_owners(8, 8, 3)
    left, right = fig.axes
    assert (left.images[0].get_array() == owners_flat(8, 8, 3).numpy()).all()
    assert (right.images[0].get_array() == owners_dim0(8, 8, 3).numpy()).all()
    assert "padding rows rank 2: 1" in right.get_xlabel() and "padding: 0" in left.get_xlabel()
    rows = [{"label": "a", "forward all-gather": 1.0, "backward all-gather": 2.0,
             "reduce-scatter": 3.0, "model": 6.0}]
    ax = plot_step_bytes(rows).axes[0]
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == 6.0 and ax.get_title() and ax.get_ylabel()
    plt.close("all")
