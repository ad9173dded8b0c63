r"""ZeRO stage 1: Adam's state sharded over the data-parallel group.

    opt = ZeRO1(model.parameters(), group=dp_group, lr=3e-3)
    loss.backward()      # plain local gradients: ZeRO1 reduces them itself
    opt.step()           # reduce-scatter grads, AdamW on this rank's shard, all-gather params
    opt.zero_grad()

Every rank keeps the whole model and computes whole gradients, as plain DP does, but owns only
1/d of the optimizer: Adam's two moments (8 bytes per parameter in fp32) for its slice of the
flattened parameters. One step:

1. reduce-scatter the flattened gradients: rank r receives the sum of slice r over the group
   (divided by d: the mean), $\frac{d-1}{d}G$ bytes on the wire;
2. AdamW on slice r only (the same elementwise update as `torch.optim.AdamW` on the whole);
3. all-gather the updated slices: every rank has every parameter again, $\frac{d-1}{d}P$ bytes.

A reduce-scatter plus an all-gather move what one all-reduce moves (module 00), so ZeRO-1 costs
plain DP's traffic and saves $(1 - \frac{1}{d})$ of the optimizer state (Rajbhandari et al.,
"ZeRO", arXiv:1910.02054). `state_bytes()` measures what this rank's optimizer holds.

The flat vector is padded with zeros to a multiple of d so every slice has the same size.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["ZeRO1"]


class ZeRO1:
    """AdamW whose moments live only for this rank's 1/d slice of the parameters."""

    def __init__(self, params: Iterable[nn.Parameter], *, group: dist.ProcessGroup | None = None,
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeRO1 needs at least one parameter that requires grad")
        self.group = group
        self.d = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        total = sum(p.numel() for p in self.params)
        self.shard = -(-total // self.d)  # ceil: slices of equal size, the last one padded
        self.padded = self.shard * self.d
        lo = self.rank * self.shard
        with torch.no_grad():
            mine = self._flat([p.detach() for p in self.params])[lo:lo + self.shard]
        self.master = nn.Parameter(mine.clone())  # (shard,): this rank's slice of the weights
        self.inner = torch.optim.AdamW([self.master], lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay)

    def _flat(self, tensors: list[Tensor]) -> Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])  # (total,)
        return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))  # (padded,)

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self._flat(grads)  # (padded,)
        mine = torch.empty(self.shard, dtype=flat.dtype, device=flat.device)
        if self.d > 1:
            dist.reduce_scatter_single(mine, flat, group=self.group)  # 1. sum of my slice
        else:
            mine.copy_(flat)
        self.master.grad = mine / self.d  # the mean over the group, as DP averages
        self.inner.step()  # 2. AdamW on my slice only
        full = torch.empty(self.padded, dtype=flat.dtype, device=flat.device)
        if self.d > 1:
            dist.all_gather_single(full, self.master.detach(), group=self.group)  # 3.
        else:
            full.copy_(self.master.detach())
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (Adam's moments and its master slice)."""
        held = self.master.numel() * self.master.element_size()
        for state in self.inner.state.values():
            held += sum(v.numel() * v.element_size() for v in state.values()
                        if isinstance(v, Tensor) and v.dim() > 0)
        return held
