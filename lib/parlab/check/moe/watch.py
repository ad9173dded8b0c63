"""Inside a rank of module 06's dispatch checks: watch every `dist.all_to_all_single` call.

Gloo does not explain a bad all-to-all: split sizes that do not match between ranks abort the
process ("Connection reset by peer") or hand back mixed rows, and a receive buffer of another
dtype than the send is refused with "Invalid usage of tensors with different dtypes", which
does not say which buffer. The watcher checks each call before it reaches gloo and raises
CheckFailed naming the mistake:

- every call: the output's dtype is the input's (the counts, int64, into an int64 buffer);
- exercise 3 (`expected` given): a call moving token rows (a 2-D floating tensor with split
  sizes) must use the sizes the routing implies, in either direction (dispatch or combine).

It wraps the function `parlab.comm` installed, so the tracer still counts every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parlab.errors import CheckFailed

__all__ = ["install", "splits_of", "NOT_EXCHANGED", "PLACEMENT"]
NOT_EXCHANGED = ("the split sizes were not exchanged: this rank used its own send sizes as "
                 "the sizes it receives. First all_to_all_single the per-expert counts (an "
                 "(E,) integer tensor, equal splits), then sum what each rank sends you")
PLACEMENT = ("experts are placed in blocks: global expert e lives on rank e // (E / ep) as "
             "local expert e % (E / ep), not on rank e % ep")
DTYPE = ("allocate the receive buffer with the dtype of what is sent: torch.empty_like(counts) "
         "for the int64 counts, x.new_empty(...) for the token rows")


def splits_of(experts: torch.Tensor, rank: int, ep: int, n: int,
              owner: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[int], list[int]]:
    """(send, recv): rows this rank sends to each rank; rows each rank sends to this rank.
    `experts` is every rank's routing, (n ep, k); rank q's tokens are rows q n .. (q+1) n."""
    dest = owner(experts)  # (n ep, k)
    send = torch.bincount(dest[rank * n:(rank + 1) * n].flatten(), minlength=ep).tolist()
    recv = [int((dest[q * n:(q + 1) * n] == rank).sum()) for q in range(ep)]
    return send, recv


def _check_dtype(rank: int, output: torch.Tensor, input: torch.Tensor) -> None:
    if output.dtype != input.dtype:
        raise CheckFailed(
            f"rank {rank}: all_to_all_single would receive into a {output.dtype} tensor what "
            f"is sent as {input.dtype} (torch does not convert; the check stopped the call "
            f"before the exchange)\nLikely mistake: " + DTYPE)


_NOW: dict[str, Any] = {}  # what the installed watcher checks against: rank, ep, expected


def install(rank: int, ep: int, expected: dict[str, Any] | None) -> None:
    """Watch dist.all_to_all_single in this rank (wrapped once; a later call only changes
    what is expected, for the next configuration a check runs). `expected`: {"blocks": (send,
    recv), "round_robin": (send, recv)} for exercise 3's uneven splits, or None (static)."""
    import torch.distributed as dist

    from parlab import comm

    _NOW.update(rank=rank, ep=ep, expected=expected)
    comm.install()
    if getattr(dist.all_to_all_single, "__parlab_watch__", False):
        return
    original = dist.all_to_all_single

    def watched(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        rank, ep, expected = _NOW["rank"], _NOW["ep"], _NOW["expected"]
        _check_dtype(rank, output, input)
        if (expected is not None and input.is_floating_point() and input.dim() == 2
                and output_split_sizes is not None):
            _check_splits(rank, ep, expected, [int(s) for s in output_split_sizes],
                          [int(s) for s in (input_split_sizes or [])])
        return original(output, input, output_split_sizes, input_split_sizes, group=group,
                        async_op=async_op)

    watched.__parlab_watch__ = True  # type: ignore[attr-defined]
    dist.all_to_all_single = watched


def _check_splits(rank: int, ep: int, expected: dict[str, Any], out_s: list[int],
                  in_s: list[int]) -> None:
    send, recv = expected["blocks"]
    if (out_s, in_s) in ((recv, send), (send, recv)):
        return
    rr_send, rr_recv = expected["round_robin"]
    rr = (out_s, in_s) in ((rr_recv, rr_send), (rr_send, rr_recv))
    hint = (PLACEMENT if rr else NOT_EXCHANGED if out_s == in_s else
            "the sizes it sends and receives come from the routing: exchange the counts first")
    raise CheckFailed(
        f"rank {rank}: all_to_all_single(output_split_sizes={out_s}, input_split_sizes="
        f"{in_s}) does not fit the routing: this rank sends {send} rows to ranks "
        f"0..{ep - 1} and receives {recv}\nLikely mistake: " + hint)
