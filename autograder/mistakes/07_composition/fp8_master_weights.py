"""Mistake: FP8 also shrinks the optimizer's fp32 master weights, to 1 byte a parameter.

FP8 training casts the GEMMs' inputs; the state is untouched: bf16 weights (each GEMM casts
its own FP8 copy from them), bf16 gradients, fp32 master weights and Adam moments, 16 bytes a
parameter in both precisions. This answer gives 2 + 2 + 1 + 8 = 13 in FP8.

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "fp32 master weights in FP8"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 2, "fp8": 1}[precision]
    bsh = b * s * h
    master = 4 if precision == "bf16" else 1  # wrong: the master weights stay fp32
    return {
        "activations": (34 - 14 * (2 - x) / 2) * bsh / t,
        "tp_all_gather": 6 * (t - 1) / t * bsh * x,
        "tp_reduce_scatter": 4 * (t - 1) / t * bsh * 2,
        "zero3_all_gather": 2 * (d - 1) / d * n_params * x,
        "zero3_reduce_scatter": (d - 1) / d * n_params * 2,
        "state": (2 + 2 + master + 8) * n_params / d,
    }
