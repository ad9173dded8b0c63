"""parlab.tp's bridge to PyTorch's tensor-parallel API (modules 02 and 03, "The same in PyTorch"):
the split model equals the fused one, the course's plans equal one device, and what the
notebooks state about PyTorch 2.13 on a CPU mesh holds.

The byte counts are written out here from the ring formulas and the model's sizes: an
all-reduce of n bytes sends 2(t-1)/t n per rank, an all-gather or reduce-scatter of a full
tensor of n bytes (t-1)/t n. What the notebooks print about PyTorch (three all-reduces without
PrepareModuleInput, the embedding's Replicate gradient, the unpadded vocabulary, the gathered
input kept, Partial LayerNorm gradients, one dropout mask on every rank of a CPU mesh) is
asserted here, so a PyTorch that changes any of it fails this file before the text goes stale.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from parlab.launch import run

V, C, HEADS, LAYERS, B, S = 37, 48, 12, 2, 2, 5


def test_split_model_is_the_fused_model() -> None:
    from parlab.tp.torch_model import SplitAttention, make_lm

    fused, split = make_lm(V, C, HEADS, LAYERS, seed=3)
    attn, cut = fused.blocks[0].attn, split.blocks[0].attn
    assert isinstance(cut, SplitAttention) and cut.n_heads == HEADS
    for j, part in enumerate((cut.q, cut.k, cut.v)):  # rows [jC, (j+1)C) of the fused weight
        assert torch.equal(part.weight, attn.qkv.weight[j * C:(j + 1) * C])
        assert torch.equal(part.bias, attn.qkv.bias[j * C:(j + 1) * C])
    ids = torch.randint(0, V, (B, S))
    assert torch.allclose(fused(ids), split(ids), atol=1e-5)
    assert not torch.allclose(fused(ids), make_lm(V, C, HEADS, LAYERS, seed=4)[0](ids))


def _course_tp() -> dict:
    from parlab import tp
    from parlab.tp import torch_compare, torch_facts, torch_plans

    yours = {"embed": tp.VocabParallelEmbedding.from_embedding, "block": tp.TPBlock.from_block,
             "f": tp.copy_to_tp_region,
             "cross_entropy": lambda x, y, v: tp.vocab_parallel_cross_entropy(x, y,
                                                                              vocab_size=v)}
    sides = torch_compare.tp_sides(V, C, HEADS, LAYERS, yours=yours,
                                   plan=torch_plans.parallelize_tp,
                                   loss=torch_plans.parallel_loss,
                                   more={"unprepared": functools.partial(
                                       torch_plans.parallelize_tp, prepare=False)})
    return {"sides": sides, "facts": torch_facts.tp_facts(V, C, HEADS)}


@pytest.mark.slow
def test_tp_plan_sends_what_megatron_sends_and_what_the_text_says() -> None:
    t = 3
    out = run(_course_tp, t, timeout=120)
    act, tok = B * S * C * 4, B * S * 4  # the float32 activation; one float32 per token
    ring = 2 * (t - 1) / t
    for rank, res in enumerate(out):
        sides = res["sides"]
        mine, theirs, one = sides["loss"]
        assert mine == pytest.approx(one, rel=1e-5) and theirs == pytest.approx(one, rel=1e-5)
        for name in ("yours", "PyTorch"):
            calls = sides[name]
            assert [(c.region, c.phase) for c in calls if c.kind == "all_reduce"] == [
                ("embedding", "forward"), ("block 0 attention", "forward"),
                ("block 0 MLP", "forward"), ("block 1 attention", "forward"),
                ("block 1 MLP", "forward"), *[("loss", "forward")] * 3,
                ("head", "backward"), ("block 1 MLP", "backward"),
                ("block 1 attention", "backward"), ("block 0 MLP", "backward"),
                ("block 0 attention", "backward")], (rank, name)
            assert len(calls) == 13, (rank, name)
            assert sum(c.wire for c in calls) == pytest.approx(ring * (10 * act + 3 * tok))
        unprepared = [(c.region, c.phase) for c in sides["more"]["unprepared"]]
        for i in range(LAYERS):  # three all-reduces into each attention in backward, not one
            assert unprepared.count((f"block {i} attention", "backward")) == 3, unprepared
        assert len(unprepared) == 13 + 2 * LAYERS
        cols = -(-V // t) if rank < t - 1 else V - (t - 1) * -(-V // t)  # torch.chunk: 13 13 11
        assert sides["columns"] == ((B, S, -(-V // t)), (B, S, cols)), rank
        facts = res["facts"]
        assert [k for k, _ in facts["attention"][False]["backward"]] == ["all_reduce"] * 3
        assert facts["attention"][True]["backward"] == [("all_reduce", act)]
        head = facts["head"]
        assert head["columns"] == cols and head["placement"] == "Shard(2)"
        assert head["loss"] == pytest.approx(head["one device"], rel=1e-5)
        assert head["loss calls"] == [("all_reduce", tok)] * 3 and head["backward calls"] == []
        assert facts["embedding"] == {"weight": ("Shard(0)", (cols, C)),
                                      "grad": ("Replicate()", (V, C))}
        assert facts["dtensor attention"].startswith("NotImplementedError"), facts


class _Ours:
    """parlab's SPBlock under the learner's names (forward(x, generator),
    reduce_replicated_grads)."""

    def __init__(self, block) -> None:
        from parlab.tp import SPBlock

        self.layer = SPBlock.from_block(block)

    def __call__(self, x, generator):
        return self.layer(x, generator)

    def reduce_replicated_grads(self) -> None:
        self.layer.allreduce_sequence_parallel_grads()


def _course_sp() -> dict:
    from parlab.tp import SPBlock, torch_compare, torch_facts, torch_plans

    megatron = functools.partial(SPBlock.from_block, regather=True)
    return {"facts": torch_facts.sp_facts(),
            "sides": torch_compare.sp_sides(C, HEADS, 12, yours=_Ours,
                                            plan=torch_plans.parallelize_sp,
                                            more={"megatron": megatron})}


@pytest.mark.slow
def test_sp_plan_keeps_the_gathered_input_and_reads_partial_grads() -> None:
    t = 2
    out = run(_course_sp, t, timeout=120)
    small = 2 * 8 * 16 * 4  # sp_facts' (B, T, C) float32 activation
    for rank, res in enumerate(out):
        layers = res["facts"]["layers"]
        keep, regather, torch_ = layers.values()
        assert torch_["kept"] == keep["kept"], rank  # the gathered inputs, to the byte
        assert keep["kept"] - regather["kept"] == 2 * (t - 1) / t * small  # two shards less
        for layer, gathers in ((keep, 2), (regather, 4), (torch_, 2)):
            assert [k for k, _ in layer["backward"]].count("all_gather") == gathers
            assert [k for k, _ in layer["forward"]] == ["all_gather", "reduce_scatter"] * 2
        grads = res["facts"]["grads"]
        assert grads["ln1.weight"] == grads["ln1.bias"] == "Partial(sum)"
        assert grads["attn.proj.bias"] == grads["mlp.fc2.bias"] == "Replicate()"
        assert res["facts"]["read"] == [("all_reduce", 16 * 4)] * 4
        assert res["facts"]["dropout"]["same mask on every rank"] is True
        sides = res["sides"]
        assert torch.allclose(*sides["y"], atol=1e-4) and torch.allclose(*sides["x.grad"],
                                                                         atol=1e-4)
        act = 2 * 12 * C * 4
        # read after backward: parlab's SPBlock all-reduces the six gradients (2 LayerNorms'
        # weight and bias, 2 biases) flattened in one call; PyTorch the four Partial ones
        for name, after in (("yours", [6 * C * 4]), ("PyTorch", [C * 4] * 4)):
            calls = sides[name]
            assert [(c.region, c.phase, c.kind) for c in calls if c.phase != "after"] == [
                ("attention", "forward", "all_gather"), ("attention", "forward", "reduce_scatter"),
                ("MLP", "forward", "all_gather"), ("MLP", "forward", "reduce_scatter"),
                ("MLP", "backward", "all_gather"), ("MLP", "backward", "reduce_scatter"),
                ("attention", "backward", "all_gather"),
                ("attention", "backward", "reduce_scatter")], (rank, name)
            assert all(c.nbytes == act for c in calls if c.phase != "after")
            assert [c.nbytes for c in calls if c.phase == "after"] == after, (rank, name)
        regathered = [(c.region, c.phase, c.kind) for c in sides["more"]["megatron"]]
        for part in ("attention", "MLP"):  # labelled by order: half of each pass a part's
            assert regathered.count((part, "backward", "all_gather")) == 2, regathered
            assert regathered.count((part, "forward", "all_gather")) == 1, regathered


def test_the_figure_and_table_draw_both_sides() -> None:
    from parlab.tp.torch_figure import calls_table, plot_step_collectives
    from parlab.tp.torch_measure import Call

    a = [Call("block 0 attention", "forward", "all_reduce", 100, 100.0),
         Call("block 0 attention", "backward", "all_reduce", 100, 100.0)]
    b = a + [Call("block 0 attention", "backward", "all_reduce", 100, 100.0)]
    table = calls_table({"yours": a, "PyTorch": b})
    assert "| block 0 attention | backward | all_reduce: 100 B | 2 × all_reduce: 200 B |" in table
    assert "**100 B**" not in table and "**200 B** | **300 B**" in table
    fig = plot_step_collectives({"yours": a, "PyTorch": b})
    backward = fig.axes[1]
    assert [p.get_width() for p in backward.patches] == [100.0, 100.0, 100.0]
    assert dist.is_available()
