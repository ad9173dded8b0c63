"""Mistake: under FP8 the reduce-scatters move 1 byte an element too, like the all-gathers.

An all-gather ahead of a GEMM moves the GEMM's input, which Transformer Engine casts to FP8
before gathering; a reduce-scatter sums GEMM outputs (or, in ZeRO-3, gradients), which leave
in bf16 and stay bf16. Counting them in FP8 halves both reduce-scatter entries in FP8 (bf16 is
right, so the check gets to the FP8 call).

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "reduce-scatters in FP8 too"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 2, "fp8": 1}[precision]
    bsh = b * s * h
    return {
        "activations": (34 - 14 * (2 - x) / 2) * bsh / t,
        "tp_all_gather": 6 * (t - 1) / t * bsh * x,
        "tp_reduce_scatter": 4 * (t - 1) / t * bsh * x,  # wrong: GEMM outputs stay bf16
        "zero3_all_gather": 2 * (d - 1) / d * n_params * x,
        "zero3_reduce_scatter": (d - 1) / d * n_params * x,  # wrong: gradients stay bf16
        "state": 16 * n_params / d,
    }
