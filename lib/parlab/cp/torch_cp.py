r"""PyTorch's own context parallelism beside the course's ring: `context_parallel` (torch 2.13).

`torch.distributed.tensor.experimental.context_parallel(mesh, buffers=, buffer_seq_dims=)`
does two things while its `with` block is open:

1. it cuts every buffer along its sequence dimension, in place (each keeps this rank's
   piece; the originals come back on exit unless listed in `no_restore_buffers`). With
   load balancing on (`_cp_options.enable_load_balance`, the default) and T divisible by 2W,
   it first reorders the sequence with `_HeadTailLoadBalancer`: rank r holds chunks r and
   2W - 1 - r of 2W, the zigzag layout of `parlab.cp.layout` (`head_tail_table`);
2. it replaces `torch.nn.functional.scaled_dot_product_attention` by a wrapper that wraps
   q, k, v as DTensors `Shard(2)` on the mesh, so DTensor's dispatcher decides what runs.

On CUDA that is a ring (`_context_parallel/_attention.py`, `_sdpa_handler`): the flash,
efficient and cuDNN kernels (forward and backward) are routed to `_templated_ring_attention`,
which passes K and V round, merges the partials through their log-sum-exps and, in the
backward, sends dK, dV round with their block (`_templated_ring_attention_backward`). How K/V
travel is `set_rotate_method`: "allgather" (the default) all-gathers every block once and
computes the local block while it flies, "alltoall" shifts one block per step. Under a causal
mask with load balancing, each step computes the whole block, the first half of its keys, or
the second half of the queries (`_is_causal_behavior`); load balancing without a causal mask
raises RuntimeError ("Load balancing requires `is_causal=True`").

On a CPU none of those kernels runs: SDPA picks the CPU flash kernel
(`_scaled_dot_product_flash_attention_for_cpu`) or, under `SDPBackend.MATH`, plain matmuls
and a softmax, and DTensor's ordinary sharding rules apply (measured here, torch 2.13):
- not causal: K and V are all-gathered (the queries stay sharded), the result is right. The
  backward all-gathers K and V again and reduce-scatters dK, dV. Under the CPU flash kernel
  DTensor finds the sharding by tracing its decomposition, many seconds of CPU for every new
  shape; under MATH the same collectives cost milliseconds (`cp_sdpa`);
- causal: the CPU flash kernel has no sharding rule (NotImplementedError), and MATH builds
  its mask as a plain tensor mixed with DTensors (RuntimeError). It does not run.

Those collectives are DTensor's functional collectives (`torch.ops._c10d_functional`), not
`torch.distributed`'s own functions. `parlab.comm`'s tracer sees the ones called through
`torch.distributed._functional_collectives` from Python (all of them here, measured), with
functional=True; `functional_trace()` (`parlab.comm.dispatch`, re-exported here) sees every
one that reaches the dispatcher, and records them as `parlab.comm.Event`s with the same byte
counts, kinds named as torch.distributed's tensor forms.

`context_parallel_attention` is the course's reference use (forward, backward, unshard);
`context_parallel` is prototype API: the names under `_attention` are private and move
between releases.
"""

from __future__ import annotations

import contextlib
import copyreg
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from parlab import comm
from parlab.comm.dispatch import functional_trace
from parlab.launch import device, uses_nccl

__all__ = ["functional_trace", "sdpa_backends", "cp_sdpa", "cp_device", "head_tail_table",
           "context_parallel_attention", "load_balanced", "reset_cp_options",
           "share_cp_options"]

def cp_device() -> torch.device:
    """Where a rank keeps context_parallel's tensors: its GPU under NCCL, else the CPU.
    Under PARLAB_ONE_GPU the ranks share a GPU over gloo, which all-gathers CPU tensors only,
    and DTensor's collectives bypass `parlab.comm.staging`'s copies through the host."""
    return device() if uses_nccl() else torch.device("cpu")


def sdpa_backends(dev: torch.device | str) -> list:
    """The SDPA backends context_parallel should use on `dev`: the kernels it turns into a
    ring on CUDA (flash, memory-efficient, cuDNN); MATH on a CPU (the fast way to the same
    all-gathers, module docstring)."""
    from torch.nn.attention import SDPBackend

    if torch.device(dev).type == "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION]
    return [SDPBackend.MATH]


def cp_sdpa(dev: torch.device | str | None = None) -> contextlib.AbstractContextManager:
    """`sdpa_kernel(sdpa_backends(dev))`, dev defaulting to `cp_device()`."""
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backends(cp_device() if dev is None else dev))


def head_tail_table(world_size: int, seq_len: int) -> Tensor:
    """(W, T/W) int64: row r is the positions context_parallel gives rank r under load
    balancing, read from torch's own `_HeadTailLoadBalancer` (T divisible by 2W)."""
    from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

    if world_size < 1 or seq_len % (2 * world_size):
        raise ValueError(f"the head-tail layout needs seq_len divisible by 2W = "
                         f"{2 * world_size}, got seq_len={seq_len}")
    order = _HeadTailLoadBalancer(seq_len, world_size, "cpu")._generate_indices()[0]
    return order.long().view(world_size, seq_len // world_size)


def load_balanced(world_size: int, seq_len: int) -> bool:
    """Whether context_parallel reorders a sequence of seq_len over world_size ranks with
    load balancing on: only when 2W divides T (`_create_default_load_balancer`)."""
    return seq_len % (2 * world_size) == 0


def reset_cp_options() -> None:
    """PyTorch's defaults: load balancing on, K/V rotated by all-gather (global state)."""
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    _cp_options.enable_load_balance = True
    set_rotate_method("allgather")


@contextlib.contextmanager
def _phase(phases: dict[str, comm.Trace] | None, name: str) -> Iterator[None]:
    if phases is None:
        yield
        return
    with functional_trace() as record:
        yield
    phases[name] = record


@contextlib.contextmanager
def _tracked(memory: dict | None) -> Iterator[Any]:
    """PyTorch's MemTracker around the block when `memory` is asked for."""
    if memory is None:
        yield None
        return
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        yield tracker


def _held(tracker: Any, which: str) -> int:
    snapshot = tracker.get_tracker_snapshot(which)
    return int(sum(per_device.get("Total", 0) for per_device in snapshot.values()))


def _torch_cp_options() -> Any:
    """PyTorch's own `_cp_options`, in the process that calls it."""
    from torch.distributed.tensor.experimental._attention import _cp_options

    return _cp_options


def _reduce_options(options: Any) -> tuple:
    if options is _torch_cp_options():
        return _torch_cp_options, ()  # by reference: the ranks' own
    return type(options), (), dict(vars(options))


def share_cp_options() -> None:
    """Ship PyTorch's `_cp_options` to the ranks as the ranks' own object, not a copy.

    A notebook's function travels to the ranks by value (cloudpickle), with a copy of every
    object it names, so `from torch.distributed.tensor.experimental._attention import
    _cp_options` at the top of a cell, then `_cp_options.enable_load_balance = False` in the
    function, would switch off a copy in the ranks while context_parallel reads PyTorch's. In
    a script under torchrun (torchtitan's way) the import is PyTorch's object; after this
    call it is in the ranks of `parlab.launch.run` too. Idempotent."""
    copyreg.pickle(type(_torch_cp_options()), _reduce_options)


def _cp_mesh(mesh: Any) -> Any:
    names = mesh.mesh_dim_names or ()
    return mesh["cp"] if mesh.ndim > 1 and "cp" in names else mesh


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, mesh: Any, *,
                               causal: bool = False, rotate: str = "allgather",
                               phases: dict[str, comm.Trace] | None = None,
                               backends: list | None = None, memory: dict | None = None
                               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention of q, k, v (B, H, T, D), whole on every rank of the CP group, through
    context_parallel over `mesh` (mesh['cp'] of a mesh with more dimensions), forward and
    backward with output gradient dout: (out, dq, dk, dv), (B, H, T, D) each in position
    order. Load balancing on exactly when causal (the ring refuses it otherwise); the caller's
    tensors are left as they are. Causal attention does not run on a CPU (module docstring).
    `phases`, when given, receives the functional collectives of "forward", "backward" and
    "unshard", each a parlab.comm.Trace; `backends`, SDPA's (default `sdpa_backends`);
    `memory`, the bytes PyTorch's MemTracker saw alive on the rank during SDPA's forward and
    backward on this rank's pieces: "turn" (between the two) and "peak"."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        _cp_options,
        context_parallel_unshard,
        set_rotate_method,
    )
    from torch.nn.attention import sdpa_kernel

    cp = _cp_mesh(mesh)
    if q.shape[2] % cp.size():
        raise ValueError(f"context_parallel cuts T = {q.shape[2]} tokens in {cp.size()} equal "
                         "pieces: T must be a multiple of the CP group's size")
    before = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = causal
    set_rotate_method(rotate)
    shards = [x.detach().clone() for x in (q, k, v, dout)]  # cut in place by context_parallel
    try:
        with sdpa_kernel(backends or sdpa_backends(q.device)), context_parallel(
                cp, buffers=shards, buffer_seq_dims=[2] * 4, no_restore_buffers=set(shards)):
            ql, kl, vl, dl = shards  # this rank's pieces, (B, H, T/W, D)
            for x in (ql, kl, vl):
                x.requires_grad_()
            with _tracked(memory) as tracker:
                with _phase(phases, "forward"):
                    out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
                if memory is not None:
                    memory["turn"] = _held(tracker, "current")
                with _phase(phases, "backward"):
                    out.backward(dl)
            if memory is not None:
                memory["peak"] = _held(tracker, "peak")
            grads = [x.grad for x in (ql, kl, vl) if x.grad is not None]
            assert len(grads) == 3, "SDPA reaches q, k and v"
            with _phase(phases, "unshard"):
                gathered = context_parallel_unshard(cp, [out.detach(), *grads], [2] * 4)
    finally:
        _cp_options.enable_load_balance = before
    return gathered[0], gathered[1], gathered[2], gathered[3]
