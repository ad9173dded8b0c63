r"""One step of a tensor-parallel model, measured in a rank: which collectives each part of it
makes, forward and backward, and what autograd keeps.

`Regions(named_modules)` labels every collective parlab.comm's tracer sees with the part of
the model that made it: a module's forward between a pre-hook that runs first and a post-hook
that runs last (so a DTensor style's input and output conversions count as the module's),
its backward from the moment the gradient of its output is ready (a hook on the output) to
the moment the gradient of its input is (a hook on the input). Collectives outside every
region are labelled "loss" while `loss()` is open, "other" otherwise. A call made while
autograd runs a node is "backward", any other "forward".

- `traced_step(model, idx, loss_fn, regions)`: forward, loss and backward of one step,
  every call as `Call(region, phase, kind, nbytes, wire)`.
- `MegatronLM`: a FusedLM's tensor-parallel copy from module 02's pieces (a vocabulary-
  parallel embedding, TP blocks, the head's columns behind f, the vocabulary-parallel loss),
  given as classes and functions: the learner's or `parlab.tp`'s.
- `saved_bytes(fn, *args, exclude)`: the bytes of the distinct storages autograd keeps while
  fn runs (a DTensor's local piece), parameters excluded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parlab import comm

__all__ = ["Call", "Regions", "traced_step", "lm_regions", "MegatronLM", "saved_bytes",
           "by_region"]


@dataclass(frozen=True)
class Call:
    """One collective of a step: the part of the model that made it, the pass, the kind, the
    payload and the bytes this rank sent (ring)."""

    region: str
    phase: str  # "forward" | "backward"
    kind: str
    nbytes: int
    wire: float


class Regions:
    """Label collectives with the module that made them (module docstring)."""

    def __init__(self, modules: Mapping[str, nn.Module]) -> None:
        self.modules, self.label = dict(modules), "other"
        self.calls: list[Call] = []
        self._handles: list[Any] = []

    def _set(self, name: str) -> Callable[[Any], None]:
        def hook(_: Any) -> None:
            self.label = name
        return hook

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple) -> None:
            self.label = name
            for a in args:
                if isinstance(a, Tensor) and a.requires_grad:
                    a.register_hook(self._set("other"))  # backward leaves the region here
        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(_: nn.Module, __: tuple, out: Any) -> None:
            self.label = "other"
            if isinstance(out, Tensor) and out.requires_grad:
                out.register_hook(self._set(name))  # backward enters the region here
        return hook

    def _listen(self, phase: str, event: comm.Event) -> None:
        if phase == "end" and not event.kind.startswith("wait("):
            running = torch._C._current_autograd_node() is not None
            self.calls.append(Call(self.label, "backward" if running else "forward",
                                   event.kind, event.nbytes, event.wire_bytes))

    @contextlib.contextmanager
    def loss(self) -> Iterator[None]:
        self.label = "loss"
        try:
            yield
        finally:
            self.label = "other"

    def __enter__(self) -> Regions:
        for name, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(self._pre(name), prepend=True))
            self._handles.append(module.register_forward_hook(self._post(name),
                                                              always_call=True))
        comm.add_listener(self._listen)
        return self

    def __exit__(self, *exc: Any) -> None:
        comm.remove_listener(self._listen)
        for handle in self._handles:
            handle.remove()


def lm_regions(model: nn.Module) -> dict[str, nn.Module]:
    """The parts of a FusedLM-shaped model (tok, blocks[i].attn / .mlp, head) by name."""
    out: dict[str, nn.Module] = {"embedding": model.tok}  # type: ignore[dict-item]
    for i, block in enumerate(model.blocks):  # type: ignore[arg-type]
        out[f"block {i} attention"], out[f"block {i} MLP"] = block.attn, block.mlp
    out["head"] = model.head  # type: ignore[assignment]
    return out


def traced_step(model: nn.Module, idx: Tensor, loss_fn: Callable[[Any], Any],
                regions: Mapping[str, nn.Module]) -> tuple[Any, Any, list[Call]]:
    """(output, what loss_fn(output) returned, the step's calls): model(idx), then loss_fn,
    which computes the loss AND runs its backward (loss_parallel needs both in its context)."""
    with Regions(regions) as seen:
        out = model(idx)
        with seen.loss():
            loss = loss_fn(out)
    return out, loss, seen.calls


def by_region(calls: list[Call]) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """{(region, phase): [(kind, payload bytes), ...]} in the order made."""
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for c in calls:
        out.setdefault((c.region, c.phase), []).append((c.kind, c.nbytes))
    return out


class _Head(nn.Module):
    """The head's rows [r n, (r+1) n) of the vocabulary padded to t n (zero rows), behind f."""

    def __init__(self, head: nn.Linear, f: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()
        vocab, n = head.out_features, -(-head.out_features // dist.get_world_size())
        w = torch.zeros(t * n, head.in_features, dtype=head.weight.dtype,
                        device=head.weight.device)
        w[:vocab] = head.weight.detach()
        self.weight = nn.Parameter(w[rank * n:(rank + 1) * n].clone())  # (n, C)
        self.f = f

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, n): this rank's columns
        return torch.nn.functional.linear(self.f(x), self.weight)


class MegatronLM(nn.Module):
    """A FusedLM under module 02's TP: `embed(lm.tok)`, `block(b)` for each block, ln_f
    replicated, the head's padded rows behind `f`; `loss(logits_shard, target)` calls
    `cross_entropy(logits_shard, target, V)` (padded columns masked)."""

    def __init__(self, lm: nn.Module, *, embed: Callable[[Any], nn.Module],
                 block: Callable[[Any], nn.Module], f: Callable[[Tensor], Tensor],
                 cross_entropy: Callable[..., Tensor]) -> None:
        super().__init__()
        import copy

        self.vocab = lm.head.out_features  # type: ignore[union-attr]
        self.tok = embed(copy.deepcopy(lm.tok))
        self.blocks = nn.ModuleList(block(copy.deepcopy(b)) for b in lm.blocks)  # type: ignore
        self.ln_f: nn.Module = copy.deepcopy(lm.ln_f)  # type: ignore[assignment]
        self.head = _Head(lm.head, f)  # type: ignore[arg-type]
        self.cross_entropy: Callable[..., Tensor] = cross_entropy

    def forward(self, idx: Tensor) -> Tensor:  # (B, T) -> (B, T, n) this rank's columns
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """The mean cross-entropy over the B T tokens, its backward run."""
        loss = self.cross_entropy(logits, target, self.vocab)
        loss.backward()
        return loss


def saved_bytes(fn: Callable[..., Any], *args: Any, exclude: Any = ()) -> int:
    """Bytes of the distinct storages autograd saves while fn(*args) runs (a DTensor counts
    its local piece), the storages of `exclude` (parameters) left out."""
    from torch.distributed.tensor import DTensor

    def local(t: Tensor) -> Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    skip = {local(p).untyped_storage().data_ptr() for p in exclude}
    kept: dict[int, Any] = {}

    def pack(t: Tensor) -> Tensor:
        storage = local(t).untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    del out
    return sum(s.nbytes() for s in kept.values())
