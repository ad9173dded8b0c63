r"""The toy model every pipeline run splits, and its single-device reference.

A stack of `n_layers` small layers, tanh(x W^T + b) of width `width` (float64 by default),
seeded so that every rank builds the same model and keeps its own stages; inputs and targets
seeded the same way; `reference` runs the full batch on one device (mean-squared-error loss,
one backward), which a pipeline's loss and gradients must equal. `stage_layers` and
`build_chunks` cut the model into stages (looped or V placement, or the learner's `layers_of`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab.pp.actions import placed_stage

__all__ = ["Layer", "make_model", "make_data", "reference", "stage_layers", "build_chunks"]


class Layer(nn.Module):
    """One layer of the toy model: tanh(x W^T + b), width -> width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:  # (b, width) -> (b, width)
        return torch.tanh(self.fc(x))


def make_model(n_layers: int = 8, width: int = 16, *, seed: int = 0,
               dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """The full model, seeded: every rank builds the same one and keeps its stages."""
    torch.manual_seed(seed)
    return nn.Sequential(*[Layer(width) for _ in range(n_layers)]).to(dtype)


def make_data(batch: int = 16, width: int = 16, *, seed: int = 0,
              dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Inputs and targets, both (batch, width)."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, width, generator=gen, dtype=dtype)
    return x, torch.randn(batch, width, generator=gen, dtype=dtype)


def reference(model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, dict[str, Tensor]]:
    """Single device, full batch: the mean-squared-error loss and every parameter gradient."""
    model = copy.deepcopy(model)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                         if p.grad is not None}


def stage_layers(stage: int, n_layers: int, n_stages: int) -> list[int]:
    """Layer indices of one stage: n_layers / n_stages consecutive layers."""
    if n_layers % n_stages:
        raise ValueError(f"{n_layers} layers do not split into {n_stages} equal stages")
    k = n_layers // n_stages
    return list(range(stage * k, (stage + 1) * k))


def build_chunks(model: nn.Sequential, rank: int, p: int, v: int,
                 layers_of: Callable[[int, int, int, int], list[list[int]]] | None = None, *,
                 placement: str = "looped") -> tuple[list[nn.Sequential], list[list[int]]]:
    """This rank's chunks (copies of its layers) and their layer indices, chunk by chunk.

    `layers_of(rank, n_layers, p, v)` may replace the placement (exercises 3 and 5)."""
    n = len(model)
    if layers_of is None:
        index = [stage_layers(placed_stage(rank, c, p, placement), n, p * v) for c in range(v)]
    else:
        index = [list(ix) for ix in layers_of(rank, n, p, v)]
    chunks = [nn.Sequential(*[copy.deepcopy(model[i]) for i in ix]) for ix in index]
    return chunks, index
