"""Tensor and sequence parallelism, forward + backward: parlab's reference layers against PyTorch's
DTensor plans, part by part: the MLP, attention, a TP + SP layer and the vocabulary-parallel loss.

    make bench        or        .venv/bin/python benchmarks/bench_tp.py [--repeats 10]

On t = 2 and 4 gloo ranks (parlab.launch.run) every rank builds the same seeded modules and
shards them twice, with parlab.tp (modules 02 and 03) and with `parallelize_module` on a CPU
DeviceMesh (parlab.tp.torch_plans, the course's answers to modules 02 and 03):

- MLP (h -> 4h -> h): `TPMLP.from_mlp` against fc1 ColwiseParallel, fc2 RowwiseParallel;
- attention (h, 8 heads): `TPAttention.from_attention` (the fused qkv, rows reordered by
  heads) against q, k, v ColwiseParallel behind one PrepareModuleInput, proj RowwiseParallel
  (`parlab.tp.torch_model.SplitAttention`, the same weights);
- TP + SP layer (a `DropoutBlock` without dropout): `SPBlock.from_block` (keeps the gathered
  input, module 03's layer) against the SequenceParallel / PrepareModuleInput plan, on this
  rank's tokens;
- loss: `vocab_parallel_cross_entropy` on this rank's columns of the logits against
  F.cross_entropy under `loss_parallel()` on the same columns as a Shard(-1) DTensor.

An iteration is a forward and a backward with a fixed output gradient (the loss's own
backward for the loss), then the gradients read as an optimizer reads them: under SP the
ones every rank holds whole summed over the ranks (parlab's
`allreduce_sequence_parallel_grads()`, DTensor's Partial ones redistributed; its biases'
are already whole). The two must first agree: output, input gradient and every local weight
gradient (parlab's fused qkv rows as q, k and v) within 1e-5, relative to its largest entry
(the keys' bias gradient, zero in exact arithmetic, against the queries'). Then they take turns
(benchmarks/_table.py) and rank 0 reports the median milliseconds per iteration and the
ratio parlab / DTensor (below 1: parlab faster), and the bytes rank 0 sends in one iteration
(parlab.comm's tracer, which sees DTensor's functional collectives too). Then fresh ranks
measure memory (benchmarks/_memory.py): the bytes of each rank's own weight shards, and the
peak RSS of one iteration above the RSS before it, largest over ranks: what the iteration
adds (activations, their gradients, communication buffers); for the MLP also the unsharded
MLP on one process, for comparison.
TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`), and the launcher's status
line is not updated at every communication call (`_table.unwatched`), as in a training job.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from _memory import mib, peak_above
from _table import Table, agree, interleave, medians, ms, ratio, repeats_option, setting, unwatched
from torch import Tensor, nn

from parlab import comm
from parlab.launch import run

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

HIDDEN, HEADS, BATCH, SEQ, VOCAB = 512, 8, 4, 128, 8192
ITERS = 3  # iterations per timed sample
TOLERANCE = 1e-5
CASES = ("MLP", "attention", "TP + SP layer", "loss")
Step = Callable[[], dict[str, Tensor]]  # one iteration; returns what the two must agree on


def _local(t: Tensor | None) -> Tensor:
    """This rank's part of a tensor or DTensor; a missing gradient is an error."""
    from torch.distributed.tensor import DTensor

    if t is None:
        raise AssertionError("a parameter or input got no gradient")
    return t.to_local() if isinstance(t, DTensor) else t


def _read(grad: Tensor | None) -> Tensor:
    """A gradient as an optimizer reads it: a Partial DTensor summed over the ranks first."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(grad, DTensor) and grad.placements[0].is_partial():
        return grad.redistribute(placements=[Replicate()]).to_local()
    return _local(grad)


def _layer_step(model: nn.Module, x: Tensor, dy: Tensor, call: Callable[..., Tensor]) -> Step:
    """Forward and backward of a layer with a fixed output gradient; returns the output, the
    input's gradient and this rank's weight gradients, by name, read as an optimizer reads
    them: the gradients every rank holds whole summed over the ranks (parlab's
    `allreduce_sequence_parallel_grads()`, module 03's SPBlock; DTensor's Partial ones
    redistributed to Replicate), so both iterations do a training step's communication."""
    def step() -> dict[str, Tensor]:
        model.zero_grad(set_to_none=True)
        xin = x.detach().requires_grad_()
        out = call(model, xin)
        out.backward(dy)
        reduce = getattr(model, "allreduce_sequence_parallel_grads", None)
        if reduce is not None:
            reduce()
        return {"output": out.detach(), "input grad": _local(xin.grad),
                **{n: _read(p.grad) for n, p in model.named_parameters()}}
    return step


def _loss_step(logits: Tensor, target: Tensor, loss: Callable[[Tensor, Tensor], Tensor], *,
               backward: bool) -> Step:
    """The loss and its backward (run here when `backward`, else inside `loss`: loss_parallel
    needs it inside its context); returns the loss and this rank's logits' gradient."""
    def step() -> dict[str, Tensor]:
        leaf = logits.detach().requires_grad_()
        value = loss(leaf, target)
        if backward:
            value.backward()
        return {"loss": _local(value).detach().reshape(1), "logits grad": _local(leaf.grad)}
    return step


def _mesh() -> DeviceMesh:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def both(case: str) -> tuple[Step, Step, dict[str, int]]:
    """In a rank: parlab's and DTensor's iteration of `case`, and the weight bytes of each."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from parlab import tp
    from parlab.model import MLP, Attention
    from parlab.tp import torch_plans
    from parlab.tp.torch_model import SplitAttention, SplitBlock

    rank, t = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, dy = (torch.randn(BATCH, SEQ, HIDDEN, generator=g) for _ in range(2))
    if case == "loss":
        logits = torch.randn(BATCH, SEQ, VOCAB, generator=g)
        target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        n = VOCAB // t
        mine = logits[..., rank * n:(rank + 1) * n].contiguous()
        theirs = DTensor.from_local(mine, _mesh(), [Shard(-1)])
        return (_loss_step(mine, target, tp.vocab_parallel_cross_entropy, backward=True),
                _loss_step(theirs, target, torch_plans.parallel_loss, backward=False),
                {"parlab": 0, "DTensor": 0})
    if case == "MLP":
        single: nn.Module = MLP(HIDDEN)
        ours: nn.Module = tp.TPMLP.from_mlp(single)
        theirs_m = parallelize_module(copy.deepcopy(single), _mesh(),
                                      {k.removeprefix("mlp."): v for k, v in
                                       torch_plans.tp_block_plan().items() if "mlp" in k})
        call: Callable[..., Tensor] = lambda m, a: m(a)  # noqa: E731
    elif case == "attention":
        single = Attention(HIDDEN, HEADS)
        ours = tp.TPAttention.from_attention(single)
        split = SplitAttention.from_attention(single)
        parent = nn.Module()  # the plan's keys name the attention "attn"
        parent.attn = split
        parallelize_module(parent, _mesh(), {k: v for k, v in
                                             torch_plans.tp_block_plan().items()
                                             if k.startswith("attn")})
        split.n_heads //= t
        theirs_m = split
        call = lambda m, a: m(a)  # noqa: E731
    else:
        single = tp.DropoutBlock(HIDDEN, HEADS, p_drop=0.0)
        ours = tp.SPBlock.from_block(single)
        theirs_m = torch_plans.parallelize_sp(SplitBlock.from_block(single), _mesh())
        n = SEQ // t
        x, dy = x[:, rank * n:(rank + 1) * n], dy[:, rank * n:(rank + 1) * n]
        return (_layer_step(ours, x, dy, lambda m, a: m(a, None)),
                _layer_step(theirs_m, x, dy, lambda m, a: m(a)),
                {"parlab": weight_bytes(ours), "DTensor": weight_bytes(theirs_m)})
    return (_layer_step(ours, x, dy, call), _layer_step(theirs_m, x, dy, call),
            {"parlab": weight_bytes(ours), "DTensor": weight_bytes(theirs_m)})


def weight_bytes(model: nn.Module) -> int:
    """Bytes of this rank's weights: the storages its parameters (or their local shards) use."""
    return sum(_local(p).untyped_storage().nbytes() for p in model.parameters())


def _their_names(case: str, ours: dict[str, Tensor]) -> dict[str, Tensor]:
    """parlab's results under the names of DTensor's modules: the fused qkv's local rows
    [Q_r; K_r; V_r] (heads first) are the local rows of q, k and v; module 03's SPBlock
    holds its layer's parameters flat (ln1, qkv, proj, ln2, fc1, fc2)."""
    prefix = {"attention": "", "TP + SP layer": "attn."}.get(case)
    if prefix is None:
        return ours
    out = {}
    for name, value in ours.items():
        layer, _, kind = name.rpartition(".")
        if layer == "qkv":
            for piece, part in zip("qkv", value.chunk(3, dim=0), strict=True):
                out[f"{prefix}{piece}.{kind}"] = part
        elif layer == "proj":
            out[f"{prefix}proj.{kind}"] = value
        elif layer in ("fc1", "fc2"):
            out[f"mlp.{name}"] = value
        else:
            out[name] = value
    return out


def _agreeing(ours: Step, theirs: Step, case: str) -> float:
    """The largest relative difference over everything both return (the output, the input's
    or the logits' gradient, every local weight gradient, the loss); raises when the two
    name different things. Under SP the gradients of the parameters every rank holds whole
    (the LayerNorms, the biases after the reduce-scatter) are compared summed, as
    `_layer_step` reads them: their local parts differ (parlab's are this rank's tokens'
    sums; DTensor's biases' gradients are Replicate, its LayerNorms' Partial)."""
    a, b = _their_names(case, ours()), theirs()
    if a.keys() != b.keys():
        raise AssertionError(f"{case}: parlab and DTensor return different things: "
                             f"{sorted(a.keys() ^ b.keys())}")
    # the keys' bias gets a zero gradient in exact arithmetic (q . b_k is the same for every
    # key of a query, and softmax ignores a shift), so both hold rounding noise: measured
    # against the queries' bias gradient, on each side
    zero = [n for n in a if n.endswith("k.bias")]
    worst = agree([(a[n], b[n]) for n in sorted(a) if n not in zero], TOLERANCE)
    for name in zero:
        scale = b[name.replace("k.bias", "q.bias")].abs().max().clamp_min(1e-30)
        worst = max(worst, float(a[name].abs().max() / scale),
                    float(b[name].abs().max() / scale))
    if worst > TOLERANCE:
        raise AssertionError(f"{case}: the keys' bias gradient is not zero on one side: "
                             f"{worst:.1e} of the queries'")
    return worst


def tp_worker(case: str, repeats: int) -> dict:
    """In each rank: build both, check they agree, count one iteration's bytes, time them."""
    ours, theirs, _ = both(case)
    with unwatched():
        diff = _agreeing(ours, theirs, case)
    sent = {}
    for name, step in (("parlab", ours), ("DTensor", theirs)):
        with comm.trace() as tr:
            step()
        sent[name] = tr.wire_bytes()
    with unwatched():
        times = medians(interleave({"parlab": ours, "DTensor": theirs}, repeats,
                                   sync=dist.barrier, iters=ITERS))
    return {"diff": diff, "times": times, "sent": sent}


def tp_memory_worker(case: str) -> dict:
    """In each rank: weight bytes and the peak memory of one iteration of each (and, for the
    MLP, of the unsharded MLP on this process alone)."""
    ours, theirs, weights = both(case)
    steps = {"parlab": ours, "DTensor": theirs}
    if case == "MLP":
        from parlab.model import MLP

        torch.manual_seed(0)
        mlp = MLP(HIDDEN)
        g = torch.Generator().manual_seed(1)
        x, dy = (torch.randn(BATCH, SEQ, HIDDEN, generator=g) for _ in range(2))
        steps["unsharded"] = _layer_step(mlp, x, dy, lambda m, a: m(a))
        weights["unsharded"] = weight_bytes(mlp)
    peaks = {}
    with unwatched():
        for name, step in steps.items():
            dist.barrier()
            peaks[name] = peak_above(step)
    return {"weights": weights, "peak": peaks}


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"TP and SP forward+backward, h={HIDDEN}, {HEADS} heads, input "
                          f"({BATCH}, {SEQ}, {HIDDEN}) float32 (the TP + SP layer: this rank's "
                          f"{SEQ}/t tokens), the loss over V={VOCAB}; ms per iteration, bytes "
                          "rank 0 sends in one (parlab.comm's tracer, ring), weights MiB per "
                          "rank and peak MiB per rank of an iteration (RSS above the rank's "
                          "before it, largest rank)", repeats),
                  ["part", "ranks", "parlab ms", "DTensor ms", "parlab / DTensor",
                   "bytes sent: parlab / DTensor", "weights MiB per rank",
                   "parlab peak MiB", "DTensor peak MiB", "max rel. difference"])
    for case in CASES:
        for world in (2, 4):
            results = run(tp_worker, world, case, repeats, timeout=600)
            times, diff = results[0]["times"], max(r["diff"] for r in results)
            memory = run(tp_memory_worker, world, case, timeout=600)
            weights = {r["weights"]["parlab"] for r in memory}
            peak = {name: max(r["peak"][name] for r in memory) for name in memory[0]["peak"]}
            sent = results[0]["sent"]
            table.add(case, world, ms(times["parlab"]), ms(times["DTensor"]),
                      ratio(times["parlab"], times["DTensor"]),
                      f"{sent['parlab']:,.0f} / {sent['DTensor']:,.0f}",
                      "" if case == "loss" else mib(max(weights)),
                      mib(peak["parlab"]), mib(peak["DTensor"]), f"{diff:.1e}")
            if case == "MLP" and world == 4:
                table.add("MLP, unsharded (one process)", 1, "", "", "", "",
                          mib(memory[0]["weights"]["unsharded"]), mib(peak["unsharded"]), "",
                          "")
    table.emit("tp")


if __name__ == "__main__":
    main()
