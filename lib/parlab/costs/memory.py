r"""Memory per device for training a dense transformer: state by part, plus activations.

State (`parlab.costs`): weights 2, gradients 2, optimizer 12 bytes per parameter
(STATE_BYTES_PER_PARAM), each part divided by the data-parallel degree d when the strategy
shards it: ddp none, zero1 the optimizer, zero2 + the gradients, zero3 / fsdp all three.

Activations (`parlab.costs.activations`, Korthikanti et al. 2022, arXiv:2205.05198, bf16):
per layer $sbh(34 + 5as/h)$ bytes; L layers keep L of them. Selective recomputation recomputes
only the attention scores (softmax, its dropout mask and output, the $5as/h$ term), so a layer
keeps $34sbh$. Full recomputation keeps only each layer's input, $2sbh$, and rebuilds one
layer's activations at a time in backward: $L\cdot 2sbh + sbh(34 + 5as/h)$. Data parallelism
does not split activations: each rank runs its own micro-batch b.
"""

from __future__ import annotations

from parlab.costs import closed_forms as costs
from parlab.costs.activations import activation_bytes_per_layer
from parlab.costs.hardware import CARDS

__all__ = ["PARTS", "GPUS", "RECOMPUTE", "recompute_mode", "state_breakdown", "activation_bytes",
           "device_memory"]

PARTS = ("weights", "gradients", "optimizer state", "activations")
GPUS = {name: memory for name, (_, memory) in CARDS.items()}
"""Card -> bytes of memory per GPU (`parlab.costs.hardware`), for the memory calculator."""
_KEYS = {"weights": "weights", "gradients": "grads", "optimizer state": "optimizer"}
RECOMPUTE = ("none", "selective", "full")
"""Recomputation settings of `activation_bytes` (False means "none", True "full")."""


def state_breakdown(n_params: float, strategy: str, dp: int) -> dict[str, float]:
    """Bytes per device of weights, gradients and optimizer state under a strategy.

    Each part is read off `costs.training_state_bytes` by difference: sharding one part changes
    the total by exactly that part's (1 - 1/d) share, so no sharding table is repeated here.
    """
    whole = costs.training_state_bytes(n_params, "ddp", 1)
    total = costs.training_state_bytes(n_params, strategy, dp)
    out = {part: costs.STATE_BYTES_PER_PARAM[key] * n_params for part, key in _KEYS.items()}
    if dp > 1:  # which parts are divided by dp: the ZeRO stages shard them in this order
        saved = whole - total
        for part in ("optimizer state", "gradients", "weights"):
            share = out[part] * (1 - 1 / dp)
            if saved >= share * (1 - 1e-12):
                out[part] /= dp
                saved -= share
    return out


def recompute_mode(recompute: bool | str) -> str:
    """"none", "selective" or "full" (False means none, True full); ValueError otherwise."""
    if isinstance(recompute, bool):
        return "full" if recompute else "none"
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (or a bool), got {recompute!r}")
    return recompute


def activation_bytes(layers: int, hidden: int, seq: int, micro_batch: int, *, heads: int,
                     recompute: bool | str = False) -> float:
    r"""Activation bytes one rank keeps for backward (see the module docstring); `recompute`
    is "none" (False), "selective" or "full" (True)."""
    mode = recompute_mode(recompute)
    per_layer = activation_bytes_per_layer(micro_batch, seq, hidden, heads, 1)
    if mode == "full":
        return layers * 2 * seq * micro_batch * hidden + per_layer
    if mode == "selective":
        return layers * 34 * seq * micro_batch * hidden
    return layers * per_layer


def device_memory(n_params: float, *, layers: int, hidden: int, seq: int, micro_batch: int,
                  strategy: str = "ddp", dp: int = 1, heads: int | None = None,
                  recompute: bool | str = False) -> dict[str, float]:
    """{part: bytes per device} for PARTS (heads defaults to hidden / 128)."""
    heads = heads or max(1, hidden // 128)
    out = state_breakdown(n_params, strategy, dp)
    out["activations"] = activation_bytes(layers, hidden, seq, micro_batch, heads=heads,
                                          recompute=recompute)
    return out
