r"""Shared machinery of the module-05 checks (`parlab.check.cp`, `parlab.check.cp_grads`).

The references are written out here, independent of parlab's own attention code: full softmax
attention in float64 (`reference`), with lse = torch.logsumexp of the masked scores and the
gradients from autograd through it. Inputs are seeded, the same on every rank; rank r gets
the rows of its positions, `x[..., pos[r], :]`.

In the ranks: `env`, `call` (learner code; a crash becomes CheckFailed saying where),
`Recorder` (every communication call and every `block_attention` in order). In the parent:
`run_ranks` (a hang becomes CheckFailed with the deadlock hint), `check_protocol` (point to
point only, to a neighbour), `lse_story` (why a log-sum-exp or an output is off).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from parlab.check import CheckFailed, fail, ranks
from parlab.launch import CollectiveTimeout, RankError

B, H, D, N = 1, 2, 8, 4  # batch, heads, head dim, tokens per rank (even: zigzag needs it)
SEED = 505
F64_TOL = {"rtol": 1e-10, "atol": 1e-12}  # float64: blocks only change the summation order
F32_TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 against a float64 reference: rounding
LARGE_TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32, scores near 100: exp amplifies rounding
FP32_EXP_MAX = math.log(torch.finfo(torch.float32).max)  # 88.7: exp overflows above this

DEADLOCK = ("every rank is waiting for a peer that is waiting too. A blocking dist.recv (or "
            "dist.send) posted first on every rank never completes, because its partner is "
            "blocked in the same call: post dist.irecv and dist.isend first, then .wait() on "
            "both (or let even ranks send first)")
MASK = ("the causal mask of the K/V block you hold at step s must use the positions of the "
        "rank it came from, pos[(r - s) % W], against your queries' pos[r]")
OVERLAP = ("post the next block's transfer before computing the current one: at step s, "
           "dist.irecv/dist.isend for step s + 1 first, then block_attention on the block you "
           "hold, then .wait() on the transfer")
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
NEIGHBOURS = ("in a ring each rank talks to its neighbours only: send to (r + 1) % W, receive "
              "from (r - 1) % W")
NO_BLOCKS = ("compute every block with block_attention (as given, called by that name): the "
             "check watches its calls to see the overlap")


# --- references --------------------------------------------------------------------------------

def inputs(seed: int, seq_len: int, dtype: torch.dtype = torch.float64,
           scale: float = 1.0, count: int = 3) -> list[Tensor]:
    """`count` tensors (B, H, T, D), seeded; q is multiplied by `scale` (large logits)."""
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(B, H, seq_len, D, generator=gen, dtype=torch.float64)
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


# --- in the ranks ------------------------------------------------------------------------------

def env() -> tuple[int, int, torch.device]:
    import torch.distributed as dist

    dev = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
           else torch.device("cpu"))
    return dist.get_rank(), dist.get_world_size(), dev


def call(stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run learner code; a crash becomes CheckFailed saying where (stubs raise as they are)."""
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else None
        fail(f"{stage} raised {type(exc).__name__}: {exc}", rank=rank,
             hint="read the error above; run your function on 2 ranks with "
                  "parlab.launch.run(...) to see it fail")


class Recorder:
    """Every p2p/collective call and block computation of this rank, in order:
    ("post", kind, peer, bytes), ("wait", kind), ("compute", kind) tuples in `.events`."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def _comm(self, phase: str, event: Any) -> None:
        if phase != "start":
            return
        if event.kind.startswith("wait("):
            self.events.append(("wait", event.kind[5:-1]))
        else:
            peer = event.group_ranks[0] if event.group_ranks else -1
            self.events.append(("post", event.kind, peer, event.wire_bytes))

    def _block(self, phase: str, record: dict) -> None:
        if phase == "start":
            self.events.append(("compute", record["kind"]))

    def __enter__(self) -> Recorder:
        from parlab import comm, cp

        comm.add_listener(self._comm)
        self._watch = cp.watch_blocks(self._block)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        from parlab import comm

        self._watch.__exit__(*exc)
        comm.remove_listener(self._comm)


def cpu(x: Any) -> Any:
    return x.detach().cpu().clone() if isinstance(x, Tensor) else x


# --- in the parent -----------------------------------------------------------------------------

def run_ranks(worker: Callable[..., Any], world_size: int, *args: Any, what: str,
              timeout: float) -> list:
    try:
        return ranks(worker, world_size, *args, timeout=timeout)
    except CollectiveTimeout as exc:
        raise CheckFailed(f"{what} did not finish on {world_size} ranks within {timeout:g} s."
                          f"\n{exc}\nLikely mistake: {DEADLOCK}") from None
    except RankError as exc:
        if exc.exc_type != "CheckFailed":
            raise
        report = next((r for r in exc.reports if r[0] == exc.rank), None)
        raise CheckFailed(report[2] if report else str(exc)) from None


_P2P = ("send", "recv", "isend", "irecv")


def check_protocol(events: list[tuple], rank: int, world: int, what: str, where: str) -> None:
    """Point-to-point calls only, each with a neighbour of `rank`."""
    posts = [e for e in events if e[0] == "post"]
    banned = [e[1] for e in posts if e[1] not in _P2P]
    if banned:
        fail(f"{where}: {what} called {', '.join(dict.fromkeys(banned))}", rank=rank,
             hint=P2P_ONLY)
    if world > 1 and not any(e[1] in ("send", "isend") for e in posts):
        fail(f"{where}: {what} sent nothing", rank=rank, hint="send the K/V blocks with "
             "dist.isend(...) (called as dist.isend: the tracer does not see a bare isend)")
    far = sorted({e[2] for e in posts if e[2] not in ((rank + 1) % world, (rank - 1) % world)})
    if far:
        fail(f"{where}: {what} talked to rank(s) {far}", rank=rank, hint=NEIGHBOURS)


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
