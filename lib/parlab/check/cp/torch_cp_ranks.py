r"""What exercise 7's check (`check_context_parallel`) does in the ranks.

Each rank builds the mesh, draws its CP group's q, k, v and output gradient (B, H, T, D)
(seeded by its data-parallel replica: the replicas of a (dp, cp) mesh hold different
sequences), resets PyTorch's CP options to their defaults (load balancing on), and calls the
learner's `cp_attention(q, k, v, dout, mesh)` under SDPA's CPU math backend (`cp_sdpa`),
watched three ways:
- `SdpaWatch` stands in for `torch.nn.functional.scaled_dot_product_attention`, so that
  context_parallel wraps it: each call records whether q arrived as a DTensor, its local
  shape and the positions of its rows, the mesh's ranks, `is_causal`, the load-balancing flag
  in force, and where the collectives stood before and after it (the forward's). What would
  hang or crash a rank, or take minutes, is refused before the original SDPA runs, the same
  way on every rank: shards of another shape than T/W tokens (a wrong `buffer_seq_dims`, or
  an uneven T the answer should have refused), a causal mask, the CPU flash kernel;
- `functional_trace` records DTensor's collectives, `parlab.comm.trace` the others;
- the inputs are compared with copies after the call.
A second case gives T one token more than a multiple of W: the answer must raise ValueError.
`ring_worker` runs the learner's exercise-2 ring on the even case's tokens (contiguous
layout, not causal), in a run of its own, for the comparison the check prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from parlab import comm
from parlab.check._compare import assert_unchanged, fail
from parlab.check._harness import call_learner, cpu, env
from parlab.cp import torch_cp
from parlab.cp.layout import position_table
from parlab.errors import LIKELY, CheckFailed

__all__ = ["B", "H", "D", "N", "SdpaWatch", "worker", "ring_worker", "inputs", "cp_groups", "HINTS",
           "REFUSED", "REFUSAL"]

B, H, D, N = 1, 2, 8, 6  # batch, heads, head size (8: CUDA's kernels), tokens per CP rank
REFUSED = [torch_cp.context_parallel_attention]
REFUSAL = "parlab.cp.torch_cp.context_parallel_attention"

HINTS = {
    "dims": "buffer_seq_dims names, for each buffer, the dimension context_parallel cuts: the "
            "sequence, dimension 2 of (B, H, T, D) (buffer_seq_dims=[2, 2, 2, 2]); each rank "
            "then holds (B, H, T/W, D)",
    "uneven": "context_parallel cuts T into W equal pieces and cannot pad: with T = {t} on "
              "W = {w} ranks the pieces differ, and the all-gather that follows mismatches "
              "(gloo aborts a rank, NCCL hangs or reads garbage). Raise ValueError when the "
              "CP group's size, mesh['cp'].size(), does not divide q.shape[2]",
    "outside": "F.scaled_dot_product_attention ran on plain tensors: call it inside `with "
               "context_parallel(mesh['cp'], buffers=..., buffer_seq_dims=...)`, on the "
               "buffers it cut, so that it sees this rank's piece as a DTensor",
    "causal": "this exercise's attention is not causal (is_causal=False): context_parallel's "
              "causal SDPA does not run on a CPU at all",
    "flash": "SDPA ran with the CPU flash kernel enabled: torch 2.13's DTensor finds that "
             "kernel's sharding by tracing its decomposition, many seconds for every new "
             "shape. Leave the backend to the caller (the check runs your function under "
             "sdpa_kernel(SDPBackend.MATH) on a CPU, the flash and efficient kernels on a GPU)",
    "math_on_gpu": "SDPA ran on the GPU without its flash, efficient or cuDNN kernel: only "
                   "those become a ring (context_parallel's _sdpa_handler); leave the backend "
                   "to the caller",
    "inputs": "context_parallel cuts its buffers in place and restores them on exit unless "
              "they are in no_restore_buffers: give it copies (t.detach().clone()), or leave "
              "the caller's tensors out of no_restore_buffers",
}


class SdpaWatch:
    """Stands in for F.scaled_dot_product_attention while the learner's code runs (module
    docstring); `calls` holds what each call saw, `refused` the first refusal's message."""

    def __init__(self, full_q: Tensor, world_cp: int, trace: comm.Trace) -> None:
        self.full_q, self.world_cp, self.trace = full_q, world_cp, trace
        self.calls: list[dict[str, Any]] = []
        self.refused: str | None = None

    def __enter__(self) -> SdpaWatch:
        self.original = F.scaled_dot_product_attention

        def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
            return self._call(*args, **kwargs)

        F.scaled_dot_product_attention = scaled_dot_product_attention
        return self

    def __exit__(self, *exc: Any) -> None:
        F.scaled_dot_product_attention = self.original

    def _positions(self, local: Tensor) -> list[int]:
        """Global positions of the local rows of q (the rows are random, so unique)."""
        full = self.full_q[0, 0].to(local.device)  # (T, D)
        rows = local[0, 0] if local.dim() == 4 and local.shape[1] else local.reshape(-1, 1)
        found = []
        for row in rows:
            same = (full == row).all(-1) if row.shape == full[0].shape else torch.zeros(0)
            hit = torch.nonzero(same)
            found.append(int(hit[0, 0]) if len(hit) else -1)
        return found

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.experimental._attention import _cp_options

        q = args[0] if args else kwargs.get("query")
        k = args[1] if len(args) > 1 else kwargs.get("key")
        causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        seen: dict[str, Any] = {"dtensor": isinstance(q, DTensor), "causal": bool(causal),
                                "load_balance": bool(_cp_options.enable_load_balance)}
        if isinstance(q, DTensor) and isinstance(k, DTensor):
            local = q.to_local()
            seen.update(mesh=[int(r) for r in q.device_mesh.mesh.flatten().tolist()],
                        local=tuple(local.shape), k_local=tuple(k.to_local().shape),
                        positions=self._positions(local.detach()))
        self.calls.append(seen)
        problem = self._problem(seen, q)
        if problem is not None:
            self.refused = problem
            fail(problem, rank=env()[0])
        seen["events"] = [len(self.trace.events)]
        out = self.original(*args, **kwargs)
        seen["events"].append(len(self.trace.events))
        return out

    def _problem(self, seen: dict, q: Any) -> str | None:
        """A refusal, the same on every rank, before anything is sent."""
        if not seen["dtensor"]:
            return ("F.scaled_dot_product_attention was called on a plain tensor.\n"
                    f"Likely mistake: {HINTS['outside']}")
        if seen["causal"]:
            return f"SDPA was called with is_causal=True.\nLikely mistake: {HINTS['causal']}"
        t, want = self.full_q.shape[2], (B, H, self.full_q.shape[2] // self.world_cp, D)
        if t % self.world_cp:
            return (f"context_parallel ran on T = {t} tokens over {self.world_cp} ranks; this "
                    f"rank's piece of q is {seen['local']}. The check expected ValueError.\n"
                    f"Likely mistake: {HINTS['uneven'].format(t=t, w=self.world_cp)}")
        if seen["local"] != want or seen["k_local"] != want:
            return (f"this rank's piece of q is {seen['local']} and of k {seen['k_local']}, "
                    f"expected {want} (T = {t} tokens over {self.world_cp} ranks).\n"
                    f"Likely mistake: {HINTS['dims']}")
        dev = q.device.type
        if dev == "cpu" and torch.backends.cuda.flash_sdp_enabled():
            return f"SDPA ran with the flash backend on a CPU.\nLikely mistake: {HINTS['flash']}"
        if dev == "cuda" and not (torch.backends.cuda.flash_sdp_enabled()
                                  or torch.backends.cuda.mem_efficient_sdp_enabled()
                                  or torch.backends.cuda.cudnn_sdp_enabled()):
            return f"SDPA ran with the math backend.\nLikely mistake: {HINTS['math_on_gpu']}"
        return None


def cp_groups(shape: tuple[int, ...], names: tuple[str, ...]) -> list[list[int]]:
    """The CP groups (global ranks) of a mesh torch.arange(world).view(shape) named `names`."""
    grid = torch.arange(math.prod(shape)).view(shape)
    if len(shape) == 1:
        return [grid.tolist()]
    axis = names.index("cp")
    moved = grid.movedim(axis, -1).reshape(-1, shape[axis])
    return moved.tolist()


def inputs(seed: int, seq_len: int, dtype: torch.dtype) -> list[Tensor]:
    """q, k, v and the output gradient, (B, H, T, D) each, seeded."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq_len, D, generator=gen, dtype=torch.float64).to(dtype)
            for _ in range(4)]


def _call(fn: Callable, mesh: Any, group: list[int], seq_len: int, seed: int,
          dtype: torch.dtype) -> dict[str, Any]:
    """One call of the learner's function on T = seq_len tokens; what it returned and saw."""
    rank, _, _ = env()
    dev = torch_cp.cp_device()
    tensors = [x.to(dev) for x in inputs(seed, seq_len, dtype)]
    kept = [x.clone() for x in tensors]
    torch_cp.reset_cp_options()
    where = f"cp_attention on {len(group)} CP ranks, T = {seq_len}"
    out: dict[str, Any] = {"group": group, "device": dev.type}
    with torch_cp.functional_trace() as functional, comm.trace() as traced, \
            SdpaWatch(kept[0], len(group), functional) as watch, torch_cp.cp_sdpa(dev):
        try:
            got = _answer(where, fn, *tensors, mesh)
        except CheckFailed as exc:
            uneven = seq_len % len(group) != 0
            if watch.refused is not None or not uneven:
                raise
            if "raised ValueError" not in str(exc):
                fail(f"{where} raised {str(exc).split(' raised ', 1)[-1].splitlines()[0]}; "
                     "the check expected ValueError", rank=rank,
                     hint=HINTS["uneven"].format(t=seq_len, w=len(group)))
            got, out["refused"] = None, str(exc)
    if watch.refused is not None:  # refused, and the answer caught it: refuse it here
        fail(watch.refused, rank=rank)
    for name, before, after in zip(("q", "k", "v", "dout"), kept, tensors, strict=True):
        assert_unchanged(before.cpu(), after, name=name, rank=rank, hint=HINTS["inputs"])
    if got is not None:
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        out["result"] = [cpu(x) if isinstance(x, Tensor) else type(x).__name__ for x in got]
    out.update(calls=watch.calls,
               functional=[(e.kind, e.nbytes, e.wire_bytes) for e in functional.events],
               traced=[(e.kind, e.nbytes, e.wire_bytes) for e in traced.events
                       if not e.functional])  # those are `functional`'s already
    return out


ERROR_HINTS = (  # words of torch's error -> what the learner most likely did
    ("must have the same length as `device_mesh.ndim`", "context_parallel takes a 1-D mesh: "
     "pass mesh['cp'], the CP dimension of the mesh you are given"),
    ("cannot resize variables that require grad", "context_parallel restores its buffers on "
     "exit by resizing them, which a tensor that requires grad refuses: make the pieces "
     "require grad inside the block (x.detach().requires_grad_()), or list your own copies in "
     "no_restore_buffers"),
    ("Load balancing requires", "load balancing is for causal masks: set "
     "_cp_options.enable_load_balance = False before context_parallel"),
    ("does not have a sharding strategy", HINTS["causal"]),
)


def _answer(where: str, fn: Callable, *args: Any) -> Any:
    """call_learner, with a likely mistake of our own where torch's error names one."""
    try:
        return call_learner(where, fn, *args, refuse=REFUSED, refusal=REFUSAL,
                            shape_hint=HINTS["dims"])
    except CheckFailed as exc:
        text = str(exc)
        hint = next((h for words, h in ERROR_HINTS if words in text), None)
        if hint is None or LIKELY not in text:
            raise
        raise CheckFailed(f"{text.split(LIKELY)[0].rstrip()}\n{LIKELY} {hint}",
                          learner_traceback=exc.learner_traceback) from None


def ring_worker(ring: Callable, seed: int) -> dict[str, Any]:
    """The learner's exercise-2 ring on the even case's tokens (1-D mesh), contiguous, not
    causal: its output rows and what it sent."""
    rank, world, dev = env()
    seq_len, dtype = N * world, _dtype()
    pos = position_table("contiguous", world, seq_len)
    q, k, v, _ = (x[..., pos[rank], :].contiguous().to(dev) for x in inputs(seed, seq_len, dtype))
    with comm.trace() as traced:
        out, _ = ring(q, k, v, pos.to(dev), causal=False)
    return {"out": cpu(out), "sent": [(e.kind, e.nbytes, e.wire_bytes) for e in traced.events]}


def _dtype() -> torch.dtype:
    return torch.float64 if torch_cp.cp_device().type == "cpu" else torch.float32


def worker(fn: Callable, shape: tuple, names: tuple, seeds: tuple[int, int]) -> dict[str, Any]:
    """The even case, then the uneven one (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, _, _ = env()
    dtype = _dtype()
    mesh = init_device_mesh(torch_cp.cp_device().type, shape, mesh_dim_names=names)
    group = next(g for g in cp_groups(shape, names) if rank in g)
    seed = seeds[0] + 100 * min(group)  # one sequence per CP group (dp replica)
    world_cp = len(group)
    return {"dtype": str(dtype).removeprefix("torch."),  # plain data: a name, not a dtype
            "even": _call(fn, mesh, group, N * world_cp, seed, dtype),
            "uneven": _call(fn, mesh, group, N * world_cp + 1, seeds[1], dtype)}
