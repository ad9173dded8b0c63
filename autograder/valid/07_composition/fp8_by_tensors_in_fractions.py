"""The FP8 exercise by each saved tensor's elements times its bytes, in exact fractions: the
activations summed tensor by tensor (Korthikanti et al.'s 34 sbh), the ring fraction as
Fraction(t - 1, t); every value a Fraction."""

from fractions import Fraction

PASSES = ['check_fp8']


def precision_costs(b, s, h, t, d, n_params, *, precision):
    gemm = 1 if precision == "fp8" else 2  # a GEMM's input; everything else bf16
    kept = [  # (elements in units of sbh, bytes each): what a layer keeps for backward
        (2, 2),     # the two LayerNorms' inputs
        (2, gemm),  # their outputs, QKV's and fc1's inputs
        (2, 1),     # the two dropout masks
        (3, 2),     # Q, K, V (attention runs in bf16)
        (1, gemm),  # the output projection's input
        (4, 2),     # the GeLU's input
        (4, gemm),  # fc2's input
    ]
    sbh = Fraction(b * s * h)
    ring_t, ring_d = Fraction(t - 1, t), Fraction(d - 1, d)
    p = Fraction(n_params)
    return {
        "activations": sum(n * nbytes for n, nbytes in kept) * sbh / t,
        "tp_all_gather": 6 * ring_t * sbh * gemm,  # 2 forward, 2 re-gathers, 2 gradients
        "tp_reduce_scatter": 4 * ring_t * sbh * 2,
        "zero3_all_gather": 2 * ring_d * p * gemm,
        "zero3_reduce_scatter": ring_d * p * 2,
        "state": 16 * p / d,
    }
