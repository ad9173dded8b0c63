r"""What precision changes: FP8 on the wire (TP's and ZeRO-3/FSDP's bytes, collective by
collective), and the training state's bytes per parameter under the recipes people run.

FP8 here is the recipe of NVIDIA's Transformer Engine and of DeepSeek-V3 (arXiv:2412.19437,
section 3.3): the GEMMs (forward, input gradient, weight gradient) take FP8 inputs, 1 byte an
element; the weights kept between steps stay bf16 (2 bytes, the copy the GEMMs cast from), the
gradients bf16, Adam's fp32 master weights and moments unchanged, so the 16 bytes per parameter
of `STATE_BYTES_PER_PARAM` (the ZeRO paper's convention, the course's) do not move. What the
course models, and nothing else:

- TP with SP (`tp_bytes_by_collective`), as Megatron-LM and Transformer Engine run it: a layer
  keeps only the sequence shard of the LayerNorm output that feeds QKV and fc1, and gathers it
  again in the backward pass for the weight gradient (Korthikanti et al. 2022,
  arXiv:2205.05198, section 4.2.2: "an extra all-gather in the backward pass"). That is what
  lets a layer keep $34\,sbh/t$ (`activations`). Per layer: forward, an all-gather into
  attention and into the MLP and a reduce-scatter out of each; backward, the re-gathers of the
  two LayerNorm outputs, the two all-gathers of the output gradient before the row-parallel
  GEMMs' backward, and the two reduce-scatters of the input gradients: 6 all-gathers and 4
  reduce-scatters, $20\frac{t-1}{t}bsh$ bytes in bf16. Keeping the gathered input instead
  (regather=False; module 03's block, whose autograd saves what F.linear was given) drops the
  two re-gathers, $16\frac{t-1}{t}bsh$ (plain TP's), and keeps $4sbh$ of LayerNorm outputs
  whole where the re-gather keeps $4sbh/t$: the memory saved, $4\frac{t-1}{t}sbh$ bytes, is
  the bytes the re-gathers send.
  Under FP8 every all-gather carries a GEMM's input, which Transformer Engine casts to FP8
  before it gathers (`gather_along_first_dim(..., quantizer=...)` in LayerNormLinear and
  LayerNormMLP, for the re-gather too, whose saved shard is FP8, and in
  `grad_output_preprocess` for the gradient); the reduce-scatters sum GEMM outputs, which
  leave the GEMM in bf16, and stay bf16. Per layer $6\frac{t-1}{t}bsh \cdot 1 +
  4\frac{t-1}{t}bsh \cdot 2 = 14\frac{t-1}{t}bsh$ instead of $20\frac{t-1}{t}bsh$.
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

The state per parameter (`state_bytes_per_param`, `STATE_RECIPES`). "bf16 weights and
gradients, fp32 Adam: 16 bytes" is how the ZeRO paper counts mixed precision (Rajbhandari et
al. 2020, arXiv:1910.02054), and the course's convention. The frameworks keep other
precisions:

- Megatron-LM with `--bf16` keeps its gradients in an fp32 buffer (`main_grad`) and reduces
  them in fp32 unless `--grad-reduce-in-bf16`: 2 + 4 + 12 = 18 bytes (its distributed
  optimizer's guide: "bf16 parameters, fp32 gradients: 18");
- torchtitan shards fp32 parameters with FSDP2, gathers them in bf16 for compute and
  reduce-scatters the gradients in fp32 (`mixed_precision_reduce = "float32"` by default): the
  fp32 weights are the master copy, 4 + 4 + 8 = 16 bytes, but the gradients are 4 of them;
- DeepSeek-V3 (arXiv:2412.19437, section 3.3) keeps fp32 master weights and fp32 gradients and
  tracks Adam's moments in bf16: 4 + 4 + 2 + 2 = 12 bytes, plus the low-precision copies its
  GEMMs read, which the report does not count.
"""

from __future__ import annotations

from parlab.costs.activations import PRECISIONS
from parlab.costs.closed_forms import ring_allgather_bytes, ring_reduce_scatter_bytes

__all__ = ["PRECISIONS", "GEMM_INPUT_BYTES", "STATE_RECIPES", "tp_bytes_by_collective",
           "fsdp_bytes_by_collective", "state_bytes_per_param"]

GEMM_INPUT_BYTES = {"bf16": 2, "fp8": 1}
"""Bytes per element of a GEMM's input (what an all-gather ahead of a GEMM moves)."""

STATE_RECIPES: dict[str, dict[str, float]] = {
    "zero": {"weights": 2, "grads": 2, "master weights": 4, "adam m": 4, "adam v": 4},
    "megatron": {"weights": 2, "grads": 4, "master weights": 4, "adam m": 4, "adam v": 4},
    "torchtitan": {"weights": 0, "grads": 4, "master weights": 4, "adam m": 4, "adam v": 4},
    "deepseek_v3": {"weights": 0, "grads": 4, "master weights": 4, "adam m": 2, "adam v": 2},
}
"""Recipe -> bytes per parameter of each part of the training state (module docstring):
"zero" the ZeRO paper's count and the course's (`STATE_BYTES_PER_PARAM`), "megatron" Megatron-LM
with --bf16 (fp32 gradients), "torchtitan" FSDP2 with fp32 sharded weights and fp32 gradient
reduction, "deepseek_v3" DeepSeek-V3's (bf16 moments; its GEMMs' low-precision copies not
counted). A weights entry of 0: the only persistent copy is the fp32 master."""


def _input_bytes(precision: str) -> int:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    return GEMM_INPUT_BYTES[precision]


def tp_bytes_by_collective(b: int, s: int, h: int, t: int, *, precision: str = "bf16",
                           regather: bool = True) -> dict[str, float]:
    r"""{"all-gather": bytes, "reduce-scatter": bytes} one rank sends for one layer under TP + SP,
    forward and backward: six ring all-gathers (four without the backward re-gather,
    regather=False) and four ring reduce-scatters of a $(b, s, h)$ tensor; the all-gathers in
    `precision`'s GEMM-input bytes, the reduce-scatters in bf16. In bf16 their sum is
    $20\frac{t-1}{t}bsh$, or `tp_bytes_per_layer`'s $16\frac{t-1}{t}bsh$ without the
    re-gather (module docstring)."""
    elems = b * s * h
    gathers = 6 if regather else 4
    return {"all-gather": gathers * ring_allgather_bytes(elems * _input_bytes(precision), t),
            "reduce-scatter": 4 * ring_reduce_scatter_bytes(elems * 2, t)}


def fsdp_bytes_by_collective(n_params: float, dp: int, *, precision: str = "bf16"
                             ) -> dict[str, float]:
    r"""{"all-gather": bytes, "reduce-scatter": bytes} one rank sends per pass of ZeRO-3 / FSDP
    over `n_params` parameters sharded on `dp` ranks: the weights gathered for the forward and
    again for the backward (in FP8 under precision="fp8"), the bf16 gradients reduce-scattered
    once. Their sum is `dp_traffic_bytes(n_params, "zero3", dp)` in bf16."""
    return {"all-gather": 2 * ring_allgather_bytes(n_params * _input_bytes(precision), dp),
            "reduce-scatter": ring_reduce_scatter_bytes(n_params * 2, dp)}


def state_bytes_per_param(recipe: str = "zero") -> float:
    """Bytes of training state per parameter, unsharded, under a recipe of `STATE_RECIPES`:
    16 for "zero" (the course's), 18 for "megatron", 16 for "torchtitan", 12 for
    "deepseek_v3"."""
    if recipe not in STATE_RECIPES:
        raise ValueError(f"recipe={recipe!r}: use one of {', '.join(STATE_RECIPES)}")
    return float(sum(STATE_RECIPES[recipe].values()))
