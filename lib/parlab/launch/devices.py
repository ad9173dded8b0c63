"""One device rule: where a rank's tensors live, which backend its groups use, what comes back.

    from parlab.launch import device
    x = torch.randn(4, 8, device=device())     # this rank's GPU under NCCL, else the CPU

- `device()`: this rank's device. Under NCCL it is the GPU the launcher gave the rank
  (`torch.cuda.set_device`), else the CPU. Every check, reference, solution and demo makes
  its tensors and modules with it; what a rank returns goes back to the caller on the CPU.
- `pick_backend(world_size, backend=None)`: what `parlab.launch.run` starts. Where every rank
  can have a GPU of its own it is the device map "cpu:gloo,cuda:nccl": CUDA tensors go through
  NCCL and a CPU tensor still works (through gloo). Otherwise "gloo".
  `PARLAB_BACKEND=gloo|nccl` forces one; `PARLAB_GPUS=2,3` says which GPUs this learner's
  ranks may use (a shared box: rank r gets the r-th of them).
- `PARLAB_ONE_GPU=0`: every rank of a run that names no backend on GPU 0, over gloo (NCCL
  takes one rank per GPU): `device()` is that GPU, and the calls gloo cannot make on CUDA
  tensors go through the host (`parlab.comm.staging`). How `make gpu-check` runs the course on
  a box with one GPU.
- `uses_nccl(group=None)`: whether a group runs NCCL for CUDA tensors. Compare backends only
  through it: with a device map `dist.get_backend()` is "cpu:gloo,cuda:nccl", not "nccl".
- `synchronize()`: wait until this rank's device has done what was queued on it. A host
  clock read after a NCCL call's `wait()` otherwise stops when the work was queued, not done.
- `pin_numerics()`: TF32 off and float32 matmuls at full precision, so that a GPU computes
  what the single-device reference computes (ranks and checks call it).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from parlab.hub.notice import announce

__all__ = ["device", "pick_backend", "placement", "uses_nccl", "gpus", "one_gpu", "place",
           "pin_numerics", "synchronize", "DEVICE_MAP"]
DEVICE_MAP = "cpu:gloo,cuda:nccl"
BACKENDS = ("gloo", "nccl")
_placed: list[int | None] = [None]  # the GPU the launcher put this rank on (place())


def _seen() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus() -> list[int]:
    """The GPUs this learner's ranks may use: PARLAB_GPUS ("2,3"), else every GPU seen."""
    seen = _seen()
    given = os.environ.get("PARLAB_GPUS", "").strip()
    if not given:
        return list(range(seen))
    try:
        chosen = [int(g) for g in given.split(",") if g.strip()]
    except ValueError:
        raise ValueError(f"PARLAB_GPUS={given!r} is not a list of GPU numbers; write it as "
                         "PARLAB_GPUS=2,3") from None
    bad = [g for g in chosen if not 0 <= g < seen]
    if bad or len(set(chosen)) != len(chosen):
        raise ValueError(f"PARLAB_GPUS={given!r} names GPUs {bad or 'twice'}; this machine has "
                         f"{seen} (0 to {seen - 1}), each may be named once")
    return chosen


def one_gpu() -> int | None:
    """PARLAB_ONE_GPU's GPU (every rank on it, over gloo), or None when it is not set."""
    given = os.environ.get("PARLAB_ONE_GPU", "").strip()
    if not given:
        return None
    seen = _seen()
    if not given.isdigit() or int(given) >= seen:
        raise ValueError(f"PARLAB_ONE_GPU={given!r} is not one of this machine's {seen} GPUs; "
                         "write it as PARLAB_ONE_GPU=0, or unset it")
    return int(given)


def place(gpu: int | None) -> None:
    """In a rank: the launcher put it on `gpu` (None: the CPU, or torchrun's LOCAL_RANK)."""
    _placed[0] = gpu


def asked_backend(backend: str | None = None) -> str | None:
    """The backend a run was asked for: the call's, else PARLAB_BACKEND's, else None."""
    return (backend or os.environ.get("PARLAB_BACKEND", "")).strip().lower() or None


def pick_backend(world_size: int, backend: str | None = None) -> str:
    """The backend a run of `world_size` ranks starts (see the module doc)."""
    backend = asked_backend(backend)
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be 'gloo', 'nccl' or None, not {backend!r} (from "
                             "the call or PARLAB_BACKEND)")
        if backend == "nccl" and world_size > len(gpus()):
            raise ValueError(f"backend='nccl' needs {world_size} GPUs, this machine has "
                             f"{len(gpus())} for you; use backend=None or 'gloo'")
        return backend
    if torch.cuda.is_available() and 0 < world_size <= len(gpus()):
        return DEVICE_MAP
    return "gloo"


def placement(world_size: int, backend: str | None = None) -> tuple[str, list[int]]:
    """(the backend a run starts, the GPU of each rank; [] on the CPU): PARLAB_ONE_GPU puts
    every rank of a run that names no backend on that GPU over gloo, else `pick_backend`,
    with a GPU per rank under NCCL."""
    shared = one_gpu() if asked_backend(backend) is None else None
    if shared is not None:
        return "gloo", [shared] * world_size
    picked = pick_backend(world_size, backend)
    if "nccl" not in picked:
        announce()  # a hub's server that got no GPU says so under the cell, once
    return picked, gpus() if "nccl" in picked else []


def uses_nccl(group: Any = None) -> bool:
    """Whether `group` (default: the world) sends CUDA tensors through NCCL."""
    return dist.is_initialized() and "nccl" in str(dist.get_backend(group))


def device() -> torch.device:
    """This rank's device: the GPU the launcher placed it on (under NCCL, or PARLAB_ONE_GPU),
    else the CPU (outside a run: the CPU). Under torchrun, whose ranks the launcher did not
    place, the GPU is LOCAL_RANK's under NCCL."""
    if _placed[0] is not None:
        return torch.device("cuda", _placed[0])
    if not uses_nccl():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    if local is not None and torch.cuda.current_device() != int(local):
        torch.cuda.set_device(int(local))
    return torch.device("cuda", torch.cuda.current_device())


def synchronize() -> None:
    """Block until this rank's GPU has finished its queued work (nothing to do on the CPU):
    call it before reading a clock that times GPU work or a NCCL call."""
    here = device()
    if here.type == "cuda":
        torch.cuda.synchronize(here)


def pin_numerics() -> None:
    """TF32 off, float32 matmuls in full precision: a GPU then rounds as the reference does."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
