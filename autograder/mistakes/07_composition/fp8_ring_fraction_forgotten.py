"""Mistake: the ring collectives send the whole tensor, (t-1)/t and (d-1)/d left out.

A ring all-gather or reduce-scatter over t ranks sends t-1 of its t pieces from each rank:
(t-1)/t of the gathered tensor. Without it the bytes are t/(t-1) too large (8/7 at TP 8), and
a group of one sends something.

Replaces precision_costs (the FP8 exercise, section 5).
"""

CAUGHT_BY = {"check_fp8": "(1 - 1/t) left out"}


def precision_costs(b, s, h, t, d, n_params, *, precision):
    x = {"bf16": 2, "fp8": 1}[precision]
    bsh = b * s * h
    return {
        "activations": (34 if precision == "bf16" else 27) * bsh / t,
        "tp_all_gather": 6 * bsh * x,  # wrong: each rank sends (t-1)/t of it
        "tp_reduce_scatter": 4 * bsh * 2,
        "zero3_all_gather": 2 * n_params * x,
        "zero3_reduce_scatter": n_params * 2,
        "state": 16 * n_params / d,
    }
