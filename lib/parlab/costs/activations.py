r"""Activation memory of a transformer layer: the closed forms, and a meter of saved tensors.

Closed forms (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", arXiv:2205.05198, section 4): bytes one layer keeps for backward, per rank, with
fp16/bf16 activations (2 bytes), 1-byte dropout masks, b micro-batch, s sequence, h hidden,
a heads, t tensor-parallel size:

| setting   | bytes per layer                                  |
|-----------|--------------------------------------------------|
| one device| $sbh\,(34 + 5\frac{as}{h})$                       |
| TP        | $sbh\,(10 + \frac{24}{t} + 5\frac{as}{ht})$       |
| TP + SP   | $\frac{sbh}{t}\,(34 + 5\frac{as}{h})$             |

The 34 sbh, region by region (`REGIONS`): the two LayerNorms' inputs 4, the inputs of the two
column-parallel GEMMs (QKV and fc1, the LayerNorm outputs) 4, the two hidden dropout masks 2
(these 10 are what TP leaves whole on every rank); Q, K, V and the output projection's input 8,
the MLP's GeLU input and fc2 input 16 (these 24 TP splits); and $5as^2b$ of attention scores
(softmax output 2, its dropout mask 1, the dropout output 2), which TP splits by heads. SP
splits the 10 along the sequence. The TP + SP row assumes what Megatron-LM and Transformer
Engine do (Korthikanti et al., section 4.2.2): the QKV and fc1 GEMMs keep only the sequence
shard of their input and all-gather it again in the backward pass, two more all-gathers a
layer (`parlab.costs.precision.tp_bytes_by_collective`: 20 instead of 16 $\frac{t-1}{t}bsh$).
A plain autograd version keeps the gathered tensor whole (regather=False, module 03's block):
$sbh(4 + \frac{30}{t} + 5\frac{as}{ht})$, $4\frac{t-1}{t}sbh$ more, and TP's bytes.

FP8 (`precision="fp8"`, `FP8_GEMM_INPUTS`): Transformer Engine's FP8 layers (NVIDIA's
"Using FP8 with Transformer Engine"; DeepSeek-AI, arXiv:2412.19437, section 3.3, "cache the
activations in FP8") keep the inputs of their GEMMs for backward in FP8, 1 byte instead of 2:
the LayerNorm outputs feeding QKV and fc1 (4 sbh become 2), the output projection's input (2
become 1) and fc2's input (8 become 4). Everything else stays bf16: the LayerNorm inputs, Q, K
and V (the attention core runs in bf16), the GeLU input, the masks and the scores. A layer
keeps $27\,sbh$ instead of $34\,sbh$.

The loss (`logits_bytes`): the output layer's logits, cast to fp32 for the cross-entropy, are
kept for backward (its gradient is softmax minus one-hot): $4\,sbV$ bytes per micro-batch, or
$4\,sbV/t$ per TP rank under Megatron-LM's vocabulary-parallel cross-entropy, where each rank
keeps its $V/t$ columns and reduces only the max, the sum of exponentials and the target logit
across the group. Korthikanti et al. (section 4.3) count them with the final LayerNorm's and the
head's inputs as $\frac{4sbh}{t}(1 + \frac{V}{h})$; the course keeps the logits' share,
$4sbV/t$, and leaves out the $4sbh/t$ (h/V of it: 6% at Llama 3 70B's h = 8192). They add that
term to the first stage's total only when p = 1 (the single stage is both ends), and call it
negligible there; with a pipeline the logits sit on the last stage, which holds one
micro-batch's activations under 1F1B, not p, so the fullest GPU is not always the first.
At s = 8192 and Llama 3's V = 128,256 that is 4.2 GB per sequence on one device, more than a
layer's $34\,sbh$ at any h below 15,000.

The meter: `SavedTensorMeter` counts what autograd saves for backward while it is open
(`torch.autograd.graph.saved_tensors_hooks`), each storage once, skipping the storages of the
tensors in `exclude` (parameters are state, not activations); `region(name)` labels what is
saved inside it, so a layer can be broken down the way the table above is.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["REGIONS", "FP8_GEMM_INPUTS", "GATHERED_INPUTS", "PRECISIONS", "LOGITS_DTYPE_BYTES",
           "activation_breakdown", "activation_bytes_per_layer", "logits_bytes", "region",
           "SavedTensorMeter", "saved_tensor_bytes"]

# region -> (coefficient of sbh, or "scores" for 5as^2b; split by TP alone?)
REGIONS: dict[str, tuple[float | str, bool]] = {
    "LayerNorm inputs": (4, False),
    "QKV and fc1 inputs (LayerNorm outputs)": (4, False),
    "hidden dropout masks": (2, False),
    "attention Q, K, V, out-proj input": (8, True),
    "attention scores (softmax, mask, dropout)": ("scores", True),
    "MLP GeLU and fc2 inputs": (16, True),
}
FP8_GEMM_INPUTS: dict[str, float] = {
    "QKV and fc1 inputs (LayerNorm outputs)": 4,
    "attention Q, K, V, out-proj input": 2,  # the out-proj input; Q, K, V stay bf16
    "MLP GeLU and fc2 inputs": 8,  # fc2's input; the GeLU input stays bf16
}
"""Region -> coefficient of sbh that is a GEMM's input, kept in FP8 (half its bytes) under
precision="fp8" (module docstring): 14 of the 34, so 34 sbh become 27 sbh."""
GATHERED_INPUTS = "QKV and fc1 inputs (LayerNorm outputs)"
"""The region SP keeps whole when the GEMMs keep their gathered input (regather=False)."""
PRECISIONS = ("bf16", "fp8")
"""What the GEMMs run in: "bf16", or "fp8" with bf16 weights and fp32 optimizer state."""
LOGITS_DTYPE_BYTES = 4
"""The logits the loss keeps for backward are fp32 (Megatron-LM casts them before the loss)."""


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return int(value)


def _precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    return precision


def activation_breakdown(b: int, s: int, h: int, a: int, t: int = 1, *, sp: bool = False,
                         keep_scores: bool = True, precision: str = "bf16",
                         regather: bool = True) -> dict[str, float]:
    """Bytes per layer and rank, region by region (`REGIONS`), fp16 activations.

    TP (t > 1) divides the regions it splits by t and leaves the others whole; sp=True divides
    every region by t, the QKV and fc1 inputs too as long as they are gathered again in
    backward (regather=True, Megatron's); regather=False keeps them gathered, whole.
    keep_scores=False counts the attention scores as 0: they are recomputed in backward
    (FlashAttention, Megatron's selective recomputation) instead of kept. precision="fp8" keeps
    the GEMM inputs (`FP8_GEMM_INPUTS`) in 1 byte instead of 2."""
    b, s, h, a, t = (_positive(n, v) for n, v in (("b", b), ("s", s), ("h", h), ("a", a),
                                                     ("t", t)))
    fp8 = _precision(precision) == "fp8"
    out = {}
    for name, (coef, split_by_tp) in REGIONS.items():
        if coef == "scores":
            full = 5.0 * a * s * s * b if keep_scores else 0.0
        else:
            full = (float(coef) - (FP8_GEMM_INPUTS.get(name, 0) / 2 if fp8 else 0)) * s * b * h
        kept_gathered = sp and not regather and name == GATHERED_INPUTS
        out[name] = full / t if (split_by_tp or sp) and not kept_gathered else float(full)
    return out


def activation_bytes_per_layer(b: int, s: int, h: int, a: int, t: int = 1, *,
                               sp: bool = False, keep_scores: bool = True,
                               precision: str = "bf16", regather: bool = True) -> float:
    r"""$sbh(34 + 5as/h)$ for t = 1, $sbh(10 + 24/t + 5as/(ht))$ with TP, $\frac{sbh}{t}(34 +
    5as/h)$ with TP + SP (bytes, fp16 activations; Korthikanti et al. 2022, table 2), or
    $sbh(4 + \frac{30}{t} + 5\frac{as}{ht})$ with the gathered inputs kept (regather=False).
    With keep_scores=False the $5as/h$ terms drop: $34sbh$, $sbh(10 + 24/t)$, $34sbh/t$. Under
    precision="fp8" the 34 is 27 (module docstring)."""
    return sum(activation_breakdown(b, s, h, a, t, sp=sp, keep_scores=keep_scores,
                                    precision=precision, regather=regather).values())


def logits_bytes(b: int, s: int, vocab: int, t: int = 1, *, vocab_parallel: bool = True
                 ) -> float:
    r"""fp32 logits one rank keeps for the loss's backward, per micro-batch: $4\,sbV/t$ under a
    vocabulary-parallel cross-entropy (each TP rank its V/t columns), $4\,sbV$ when the logits
    are gathered on every TP rank before the loss (module docstring)."""
    b, s, vocab, t = (_positive(n, v) for n, v in (("b", b), ("s", s), ("vocab", vocab),
                                                  ("t", t)))
    return LOGITS_DTYPE_BYTES * b * s * vocab / (t if vocab_parallel else 1)


# --- measuring saved tensors ---------------------------------------------------------------------

_current = ["other"]  # the label of what autograd saves now


@contextlib.contextmanager
def region(name: str) -> Iterator[None]:
    """Label the tensors saved for backward inside this block (for SavedTensorMeter)."""
    previous, _current[0] = _current[0], name
    try:
        yield
    finally:
        _current[0] = previous


class SavedTensorMeter:
    """While open, record every storage autograd saves for backward: bytes, by region.

        with SavedTensorMeter(exclude=model.parameters()) as meter:
            y = model(x)
        meter.total, meter.by_region      # {"LayerNorm": ..., "other": ...}

    A storage saved twice (x * x saves x twice; a view saves its base) counts once, under the
    region that saved it first. The meter keeps the storages alive, so none is freed and its
    address reused while it counts; drop the meter to release them.
    """

    def __init__(self, *, exclude: Iterable[Tensor] = ()) -> None:
        self._skip = {p.untyped_storage().data_ptr() for p in exclude}
        self._saved: dict[int, tuple[str, Any]] = {}
        self._hooks: Any = None

    def _pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in self._skip and key not in self._saved:
            self._saved[key] = (_current[0], storage)
        return tensor

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(s.nbytes() for _, s in self._saved.values())

    @property
    def by_region(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, storage in self._saved.values():
            out[name] = out.get(name, 0) + storage.nbytes()
        return out


def saved_tensor_bytes(fn: Callable[..., Any], *args: Any, exclude: Iterable[Tensor] = (),
                       **kwargs: Any) -> int:
    """Bytes of the storages autograd saves while `fn(*args, **kwargs)` runs (see the meter)."""
    with SavedTensorMeter(exclude=exclude) as meter:
        fn(*args, **kwargs)
    return meter.total
