"""GPU tensors through gloo: staged through the host where gloo cannot take them.

Used when every rank of a run shares one GPU (`PARLAB_ONE_GPU`, parlab.launch.devices): NCCL
allows one rank per GPU in a communicator, so such ranks talk over gloo, and gloo takes CUDA
tensors only for all_reduce, broadcast and barrier (torch.distributed's backend table). For
every other call (send, recv, all_gather, reduce_scatter, all_to_all, ...) `staged(kind, fn)`
copies each CUDA tensor argument to the host, makes the call on the copies, and copies them
back into the originals when the call is done: at once for a blocking call, at `wait()` for
an asynchronous one. Inputs come back unchanged; outputs and receive buffers get the result.

`parlab.comm` calls it inside its wrappers, so the tracer and NCCL's rules still see the
learner's own tensors, on the GPU. `enable()` turns it on in a rank; `devices` says which
device types are staged (the tests stage CPU tensors, to see the copies on a CPU machine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["GLOO_TAKES_CUDA", "enable", "disable", "staged"]

GLOO_TAKES_CUDA = frozenset({"all_reduce", "broadcast", "barrier"})
"""Calls gloo runs on CUDA tensors itself; the rest go through the host (batch_isend_irecv
too, through the isend and irecv calls it makes, each staged)."""
_NOT_STAGED = GLOO_TAKES_CUDA | {"batch_isend_irecv"}
_staged_types: set[str] = set()  # device types staged ("cuda"); empty: staging is off
copies = [0]  # tensors staged so far in this process (for tests)


def enable(devices: tuple[str, ...] = ("cuda",)) -> None:
    """Stage tensors of these device types in every call gloo cannot make on them."""
    _staged_types.clear()
    _staged_types.update(devices)


def disable() -> None:
    _staged_types.clear()


class _StagedWork:
    """The handle of an asynchronous staged call: waiting also copies the results back."""

    def __init__(self, work: Any, back: Callable[[], None]) -> None:
        self._work, self._back = work, back

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs)
        self._back()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _stage(x: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """x with every tensor of a staged device type replaced by a host copy (recorded)."""
    if isinstance(x, torch.Tensor) and x.device.type in _staged_types:
        host = x.detach().to("cpu", copy=True)
        pairs.append((x, host))
        copies[0] += 1
        return host
    if isinstance(x, list | tuple):
        return type(x)(_stage(v, pairs) for v in x)
    return x


def staged(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` itself, unless staging is on and `kind` is a call gloo cannot make on the GPU:
    then a function that makes it on host copies and copies the results back."""
    if not _staged_types or kind in _NOT_STAGED:
        return fn

    def through_host(*args: Any, **kwargs: Any) -> Any:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        args = _stage(args, pairs)
        kwargs = {k: _stage(v, pairs) for k, v in kwargs.items()}

        def back() -> None:
            with torch.no_grad():
                for original, host in pairs:
                    original.copy_(host)

        out = fn(*args, **kwargs)
        if hasattr(out, "wait"):  # asynchronous: the results are there after wait()
            return _StagedWork(out, back)
        back()
        return out

    return through_host
