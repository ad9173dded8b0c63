"""Mistake: under FP8 a layer keeps all of its 34 sbh/t in half the bytes, 17 sbh/t.

Only the GEMMs' inputs are kept in FP8: the LayerNorm outputs (4), the output projection's
input (2) and fc2's input (8), 14 of the 34. The LayerNorm inputs, Q, K and V, the GeLU input
and the masks stay as they were: 27 sbh/t.

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "FP8 applied to all 34 sbh"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 2, "fp8": 1}[precision]
    bsh = b * s * h
    return {
        "activations": 34 * x / 2 * bsh / t,  # wrong: only the GEMM inputs halve
        "tp_all_gather": 6 * (t - 1) / t * bsh * x,
        "tp_reduce_scatter": 4 * (t - 1) / t * bsh * 2,
        "zero3_all_gather": 2 * (d - 1) / d * n_params * x,
        "zero3_reduce_scatter": (d - 1) / d * n_params * 2,
        "state": 16 * n_params / d,
    }
