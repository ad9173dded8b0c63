"""Mistake: TP + SP sends four all-gathers a layer, as plain TP's all-reduces would suggest.

A layer that keeps 34 sbh/t keeps only the sequence shard of each LayerNorm output; Megatron-LM
and Transformer Engine gather it again in the backward pass for the weight gradient
(Korthikanti et al. 2022, section 4.2.2): six all-gathers a layer, not four. This was the
exercise's own answer before the course corrected it, so an answer written then (make update
carries it over) reads the same: 2/3 of the all-gathers, in both precisions.

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "Exercise 3c asked for four"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 2, "fp8": 1}[precision]
    bsh = b * s * h
    return {
        "activations": (34 - 14 * (2 - x) / 2) * bsh / t,
        "tp_all_gather": 4 * (t - 1) / t * bsh * x,  # wrong: the two re-gathers left out
        "tp_reduce_scatter": 4 * (t - 1) / t * bsh * 2,
        "zero3_all_gather": 2 * (d - 1) / d * n_params * x,
        "zero3_reduce_scatter": (d - 1) / d * n_params * 2,
        "state": 16 * n_params / d,
    }
