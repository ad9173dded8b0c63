"""Mistake: the collectives' bytes are counted in elements, as if bf16 took 1 byte (FP8 half).

A bf16 element is 2 bytes and an FP8 one 1. The activations' 34 and 27 are already bytes, so
they pass; the first collective, TP's all-gathers in bf16, comes out half.

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "1 byte an element where bf16 takes 2"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 1, "fp8": 0.5}[precision]  # wrong: bf16 is 2 bytes, FP8 1
    bsh = b * s * h
    return {
        "activations": (34 if precision == "bf16" else 27) * bsh / t,
        "tp_all_gather": 6 * (t - 1) / t * bsh * x,
        "tp_reduce_scatter": 4 * (t - 1) / t * bsh * 1,
        "zero3_all_gather": 2 * (d - 1) / d * n_params * x,
        "zero3_reduce_scatter": (d - 1) / d * n_params * 1,
        "state": 16 * n_params / d,
    }
