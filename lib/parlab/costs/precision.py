r"""What FP8 training changes on the wire: TP's and ZeRO-3/FSDP's bytes, collective by collective.

FP8 here is the recipe of NVIDIA's Transformer Engine and of DeepSeek-V3 (arXiv:2412.19437,
section 3.3): the GEMMs (forward, input gradient, weight gradient) take FP8 inputs, 1 byte an
element; the weights kept between steps stay bf16 (2 bytes, the copy the GEMMs cast from), the
gradients bf16, Adam's fp32 master weights and moments unchanged, so the 16 bytes per parameter
of `STATE_BYTES_PER_PARAM` do not move. What the course models, and nothing else:

- TP with SP (`tp_bytes_by_collective`): a layer's four all-gathers (forward: the LayerNorm
  output before QKV and fc1; backward: the output gradient before the row-parallel GEMMs'
  backward) gather a GEMM's input, which Transformer Engine casts to FP8 before it gathers
  (`gather_along_first_dim(..., quantizer=...)` in its LayerNormLinear and LayerNormMLP, and
  in `grad_output_preprocess` for the gradient); the four reduce-scatters sum GEMM outputs,
  which leave the GEMM
  in bf16, and stay bf16. Per layer $4\frac{t-1}{t}bsh \cdot 1 + 4\frac{t-1}{t}bsh \cdot 2 =
  12\frac{t-1}{t}bsh$ bytes instead of $16\frac{t-1}{t}bsh$: the all-gathers' half halves.
- ZeRO-3 / FSDP (`fsdp_bytes_by_collective`): the two parameter all-gathers of a step (forward
  and backward) in FP8, as torchao's float8 training does with
  `Float8LinearConfig(enable_fsdp_float8_all_gather=True)` (used by torchtitan): each rank
  casts its shard to FP8 and the gathered weight is the GEMM's FP8 input; the gradients'
  reduce-scatter stays bf16. $(1 + 1 + 2)\frac{d-1}{d}P$ bytes instead of $(2 + 2 + 2)$; the
  gathered layers held in memory are FP8 too.

Left unchanged, and said so where the planner uses them: DP's gradient all-reduce (ddp, zero1,
zero2: bf16 gradients, and ZeRO-1/2 gather the bf16 weights the optimizer wrote), PP's
activations and gradients between stages, CP's K and V (bf16 attention), EP's all-to-alls
(DeepSeek-V3 dispatches in FP8 and combines in bf16, which this course does not model), and
the compute time (FP8 GEMMs run up to twice bf16's peak, which the planner does not credit).
Transformer Engine can also cache the weights' FP8 copies across micro-batches (1-2 bytes per
parameter); that cache is not counted.
"""

from __future__ import annotations

from parlab.costs.activations import PRECISIONS
from parlab.costs.closed_forms import ring_allgather_bytes, ring_reduce_scatter_bytes

__all__ = ["PRECISIONS", "GEMM_INPUT_BYTES", "tp_bytes_by_collective", "fsdp_bytes_by_collective"]

GEMM_INPUT_BYTES = {"bf16": 2, "fp8": 1}
"""Bytes per element of a GEMM's input (what an all-gather ahead of a GEMM moves)."""


def _input_bytes(precision: str) -> int:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    return GEMM_INPUT_BYTES[precision]


def tp_bytes_by_collective(b: int, s: int, h: int, t: int, *, precision: str = "bf16"
                           ) -> dict[str, float]:
    r"""{"all-gather": bytes, "reduce-scatter": bytes} one rank sends for one layer under TP + SP,
    forward and backward: four ring all-gathers and four ring reduce-scatters of a $(b, s, h)$
    tensor; the all-gathers in `precision`'s GEMM-input bytes, the reduce-scatters in bf16.
    Their sum is `tp_bytes_per_layer` in bf16 (module docstring)."""
    elems = b * s * h
    return {"all-gather": 4 * ring_allgather_bytes(elems * _input_bytes(precision), t),
            "reduce-scatter": 4 * ring_reduce_scatter_bytes(elems * 2, t)}


def fsdp_bytes_by_collective(n_params: float, dp: int, *, precision: str = "bf16"
                             ) -> dict[str, float]:
    r"""{"all-gather": bytes, "reduce-scatter": bytes} one rank sends per pass of ZeRO-3 / FSDP
    over `n_params` parameters sharded on `dp` ranks: the weights gathered for the forward and
    again for the backward (in FP8 under precision="fp8"), the bf16 gradients reduce-scattered
    once. Their sum is `dp_traffic_bytes(n_params, "zero3", dp)` in bf16."""
    return {"all-gather": 2 * ring_allgather_bytes(n_params * _input_bytes(precision), dp),
            "reduce-scatter": ring_reduce_scatter_bytes(n_params * 2, dp)}
