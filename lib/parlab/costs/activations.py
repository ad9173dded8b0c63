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
splits the 10 along the sequence. Megatron gets the GEMM inputs down to $1/t$ by keeping only
the sequence shard and all-gathering it again in backward; a plain autograd version keeps the
gathered tensor whole.

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

__all__ = ["REGIONS", "activation_breakdown", "activation_bytes_per_layer", "region",
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


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return int(value)


def activation_breakdown(b: int, s: int, h: int, a: int, t: int = 1, *, sp: bool = False,
                         keep_scores: bool = True) -> dict[str, float]:
    """Bytes per layer and rank, region by region (`REGIONS`), fp16 activations.

    TP (t > 1) divides the regions it splits by t and leaves the others whole; sp=True divides
    every region by t. keep_scores=False counts the attention scores as 0: they are recomputed
    in backward (FlashAttention, Megatron's selective recomputation) instead of kept."""
    b, s, h, a, t = (_positive(n, v) for n, v in (("b", b), ("s", s), ("h", h), ("a", a),
                                                     ("t", t)))
    out = {}
    for name, (coef, split_by_tp) in REGIONS.items():
        if coef == "scores":
            full = 5.0 * a * s * s * b if keep_scores else 0.0
        else:
            full = float(coef) * s * b * h
        out[name] = full / t if (split_by_tp or sp) else float(full)
    return out


def activation_bytes_per_layer(b: int, s: int, h: int, a: int, t: int = 1, *,
                               sp: bool = False, keep_scores: bool = True) -> float:
    r"""$sbh(34 + 5as/h)$ for t = 1, $sbh(10 + 24/t + 5as/(ht))$ with TP, $\frac{sbh}{t}(34 +
    5as/h)$ with TP + SP (bytes, fp16 activations; Korthikanti et al. 2022, table 2). With
    keep_scores=False the $5as/h$ terms drop: $34sbh$, $sbh(10 + 24/t)$, $34sbh/t$."""
    return sum(activation_breakdown(b, s, h, a, t, sp=sp, keep_scores=keep_scores).values())


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
