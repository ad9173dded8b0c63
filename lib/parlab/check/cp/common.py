r"""What module 05's checks share: sizes, tolerances, hints and the references.

The references are written out here, independent of parlab's own attention code: full softmax
attention in float64 (`reference`), with lse = torch.logsumexp of the masked scores and the
gradients from autograd through it. Inputs are seeded, the same on every rank; rank r gets
the rows of its positions, `x[..., pos[r], :]`. Each rank holds N = 6 tokens, so the sequence
is 6W long: 12, 18, 24 tokens on 2, 3, 4 ranks, never a power of two; batch 1, 2 heads of 8.
One case of each ring check (and of the merge) has other sizes, `OTHER_DIMS` and `OTHER_N`
(batch 2, 3 heads of 6, 4 tokens per rank): an answer must read them from its tensors.

`lse_story` turns a wrong (out, lse) into a likely-mistake sentence; `RingCase` is one case
of the ring checks (layout, mask, dtype, scale, tolerance, position table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["B", "H", "D", "N", "OTHER_DIMS", "OTHER_N", "SEED", "F64_TOL", "F32_TOL",
           "LARGE_TOL", "RingCase", "inputs", "reference", "lse_story"]

B, H, D, N = 1, 2, 8, 6  # batch, heads, head dim, tokens per rank (even: zigzag needs it)
OTHER_DIMS, OTHER_N = (2, 3, 6), 4  # one case of each ring check: other sizes, read from k
SEED = 505
F64_TOL = {"rtol": 1e-10, "atol": 1e-12}  # float64: blocks only change the summation order
F32_TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 against a float64 reference: rounding
LARGE_TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32, scores near 100: exp amplifies rounding
FP32_EXP_MAX = math.log(torch.finfo(torch.float32).max)  # 88.7: exp overflows above this

DEADLOCK = ("every rank is waiting for a peer that is waiting too. A blocking dist.recv (or "
            "dist.send) posted first on every rank never completes, because its partner is "
            "blocked in the same call: post dist.isend and dist.irecv without waiting, even "
            "ranks sending first and odd ranks receiving first (NCCL needs that order with 2 "
            "ranks, where left and right are one peer), then .wait() on both")
MASK = ("the causal mask of the K/V block you hold at step s must use the positions of the "
        "rank it came from, pos[(r - s) % W], against your queries' pos[r]")
OVERLAP = ("post the next block's transfer before computing the current one: at step s, "
           "dist.isend/dist.irecv for step s + 1 first (even ranks sending first), then "
           "block_attention on the block you hold, then .wait() on the transfer")
BF16 = ("the log-sum-exp has bf16 precision: bf16 keeps 8 significant bits, so an lse of 10 "
        "is off by up to 0.03 and every merge weight exp(lse_a - lse) by up to 3%. Merge "
        "(and keep) the log-sum-exp in float32")
MAX_SHIFT = ("exp(lse) overflows float32 above 88.7 (here lse reaches {top:.0f}): subtract the "
             "larger of the two lse (m = max(lse_a, lse_b)) before exponentiating, so every "
             "exponent is <= 0")
MASKED_NAN = ("a fully masked block has lse = -inf and out = 0, and exp(-inf - (-inf)) is nan: "
              "when both lse are -inf use a finite shift (0) and give that block weight 0")
WEIGHTS = ("the merged lse is log(exp(lse_a) + exp(lse_b)), and out = exp(lse_a - lse) * out_a "
           "+ exp(lse_b - lse) * out_b: the two weights add up to 1")
P2P_ONLY = ("ring attention passes K/V blocks with dist.isend/dist.irecv (or dist.send/recv) "
            "only; the exercise is to build the ring, not to all-gather")
NEIGHBOURS = ("blocks travel round the ring from rank r to rank r + 1: receive from the left "
              "neighbour (rank - 1) % W and send to the right one (rank + 1) % W. A receive "
              "from the rank you send to waits for a message that rank never sends")
INPUTS = ("leave the tensors you are given as they are: receive into new buffers "
          "(torch.empty_like(k)) and rebind names (k = k_next) instead of writing into k, v "
          "or q (k.copy_(...), dist.irecv(k, ...)); the caller still needs its own tokens")


@dataclass(frozen=True)
class RingCase:
    """One case of the ring checks, the same on every rank."""

    name: str
    layout: str
    causal: bool
    dtype: torch.dtype
    scale: float
    tol: tuple[float, float]  # (rtol, atol)
    table: Tensor  # (W, n) global positions of every rank's tokens
    seed: int
    dims: tuple[int, int, int] = (B, H, D)  # batch, heads, head size

    @property
    def tolerance(self) -> dict[str, float]:
        return {"rtol": self.tol[0], "atol": self.tol[1]}

    @property
    def seq(self) -> int:
        """T, the tokens of every rank together."""
        return self.table.numel()


def inputs(seed: int, seq_len: int, dtype: torch.dtype = torch.float64,
           scale: float = 1.0, count: int = 3,
           dims: tuple[int, int, int] = (B, H, D)) -> list[Tensor]:
    """`count` tensors (batch, heads, T, head size) of `dims`, seeded; q is multiplied by
    `scale` (large logits)."""
    gen = torch.Generator().manual_seed(seed)
    batch, heads, head = dims
    out = [torch.randn(batch, heads, seq_len, head, generator=gen, dtype=torch.float64)
           for _ in range(count)]
    out[0] = out[0] * scale
    return [x.to(dtype) for x in out]


def reference(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor,
              causal: bool) -> tuple[Tensor, Tensor]:
    """float64 softmax attention of queries at q_pos over keys at k_pos: (out, lse); rows with
    every key masked get out 0 and lse -inf."""
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, nq, nk)
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, nq)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return p @ v.double(), lse


def _bf16_exact(x: Tensor) -> bool:
    x = x[torch.isfinite(x)].float()
    return x.numel() > 0 and bool((x.bfloat16().float() == x).all())


def lse_story(got_out: Tensor, got_lse: Tensor, want_lse: Tensor,
              input_lse: list[Tensor] | None = None) -> str | None:
    """A likely-mistake sentence for a wrong (out, lse), or None when nothing stands out."""
    tops = [float(x[torch.isfinite(x)].max()) for x in (input_lse or [want_lse])
            if bool(torch.isfinite(x).any())]
    top = max(tops, default=0.0)
    broken = ~torch.isfinite(got_lse) & torch.isfinite(want_lse)
    broken = broken | (torch.isnan(got_out).any(-1) & torch.isfinite(want_lse))
    if bool(broken.any()) and top > FP32_EXP_MAX and got_lse.dtype != torch.float64:
        return MAX_SHIFT.format(top=top)
    if bool(torch.isnan(got_out).any() | torch.isnan(got_lse).any()):
        masked = input_lse is not None and any(bool(torch.isinf(x).any()) for x in input_lse)
        return MASKED_NAN if masked or bool(torch.isinf(want_lse).any()) else None
    if got_lse.dtype == torch.bfloat16 or (_bf16_exact(got_lse) and not _bf16_exact(want_lse)):
        return BF16
    return None
