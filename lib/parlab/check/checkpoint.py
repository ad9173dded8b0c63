r"""Graded check of module 09, "Checkpoints and restarts".

`check_reshard(reshard)`: the learner's resharding of one TP-sharded weight and its two Adam
moments from t_old to t_new pieces, by hand on plain tensors, against what
torch.distributed.checkpoint itself loads: t_old ranks save their pieces as DTensors
(`Shard(dim)`) with `dcp.save`, t_new ranks load them with `dcp.load` and `Shard(dim)`, and
new rank r's loaded tensors are the expected piece r. One launch of 4 ranks answers every case
(each case saves from a subgroup of t_old ranks and loads on one of t_new).

Every case: inputs unchanged after the call, every returned tensor owns its memory (a view of
an assembled whole keeps the whole alive on every rank), of the old pieces' dtype, and DCP and
parlab's own resharding refused while the answer runs.

What a right answer must not depend on, and how the tests vary it:

- t_old and t_new: visible 2 -> 4 (split), 4 -> 2 (merge) and 2 -> 3 (3 divides neither: no
  answer that splits or merges neighbours passes); hidden 4 -> 3, 3 -> 4 and 3 -> 2;
- the dim TP split: 0 (a column-parallel weight) and 1 (a row-parallel one), both visible;
- the shape (never square) and the dtype: float32, bfloat16 (visible) and float64 (hidden),
  the new pieces in the old pieces' dtype, as DCP loads them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from parlab.check._compare import assert_owns_only, assert_unchanged, expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport, run_checked
from parlab.compose.checkpoint import load_state, save_state
from parlab.compose.shards import reshard_pieces
from parlab.launch.scratch import scratch_dir

__all__ = ["check_reshard", "CASES", "HIDDEN", "KEYS", "make_pieces", "dcp_reference"]

KEYS = ("weight", "exp_avg", "exp_avg_sq")
Case = tuple[int, int, int, tuple[int, int], torch.dtype]  # t_old, t_new, dim, shape, dtype
CASES: list[Case] = [(2, 4, 0, (8, 6), torch.float32), (4, 2, 1, (6, 8), torch.float32),
                     (2, 3, 0, (12, 5), torch.bfloat16)]
HIDDEN: list[Case] = [(4, 3, 0, (12, 4), torch.float32), (3, 4, 1, (5, 12), torch.float64),
                      (3, 2, 1, (4, 6), torch.bfloat16)]
REFUSED = [dcp.save, dcp.load, getattr(dcp.save, "__wrapped__", dcp.save),
           getattr(dcp.load, "__wrapped__", dcp.load), DTensor.redistribute, DTensor.full_tensor,
           distribute_tensor, reshard_pieces, load_state, save_state]
WORLD = 4


def _name(case: Case) -> str:
    t_old, t_new, dim, shape, dtype = case
    kind = "" if dtype == torch.float32 else f", {str(dtype).removeprefix('torch.')}"
    return f"t = {t_old} -> {t_new} along dim {dim} (whole tensor {shape}{kind})"


def make_pieces(case: Case, seed: int) -> list[dict[str, Tensor]]:
    """t_old pieces of a random weight and its moments (exp_avg_sq > 0, as Adam's is)."""
    t_old, _, dim, shape, dtype = case
    g = torch.Generator().manual_seed(seed)
    whole = {"weight": torch.randn(shape, generator=g).to(dtype),
             "exp_avg": (1e-3 * torch.randn(shape, generator=g)).to(dtype),
             "exp_avg_sq": (1e-6 * torch.rand(shape, generator=g)).to(dtype)}
    return [{k: v.chunk(t_old, dim)[r].clone() for k, v in whole.items()} for r in range(t_old)]


def _dcp_case(case: Case, pieces: list[dict[str, Tensor]], path: str) -> dict[str, Tensor] | None:
    """On every rank: save from ranks < t_old, load on ranks < t_new; this rank's loaded piece."""
    t_old, t_new, dim, shape, dtype = case
    rank, whole = dist.get_rank(), torch.empty(shape, device="meta")
    old, new = dist.new_group(list(range(t_old))), dist.new_group(list(range(t_new)))
    if rank < t_old:
        mesh = DeviceMesh.from_group(old, "cpu")
        state = {k: DTensor.from_local(pieces[rank][k], mesh, [Shard(dim)], run_check=False,
                                       shape=whole.shape, stride=whole.stride()) for k in KEYS}
        dcp.save(state, checkpoint_id=path, process_group=old)
    dist.barrier()
    if rank >= t_new:
        return None
    mesh = DeviceMesh.from_group(new, "cpu")
    local = list(shape)
    local[dim] //= t_new
    out = {k: torch.zeros(local, dtype=dtype) for k in KEYS}
    dcp.load({k: DTensor.from_local(out[k], mesh, [Shard(dim)], run_check=False,
                                    shape=whole.shape, stride=whole.stride()) for k in KEYS},
             checkpoint_id=path, process_group=new)
    return out


def dcp_reference(cases: list[Case], seeds: list[int], root: str) -> list[dict | None]:
    """Each rank's DCP-loaded piece of every case (run on 4 ranks)."""
    out = [_dcp_case(c, make_pieces(c, s), f"{root}/case{i}")
           for i, (c, s) in enumerate(zip(cases, seeds, strict=True))]
    dist.barrier()  # destroy right after a load can abort (NOTES.md)
    return out


_LOADED: dict[tuple[Case, int], list[dict[str, Tensor]]] = {}
"""DCP's pieces of each (case, seed), kept for the kernel's life: the same inputs give the
same pieces, so a second check (the hidden test after the visible one) starts no ranks for
the cases it shares. The learner never sees these tensors."""


def _reference(cases: list[Case], seeds: list[int]) -> list[list[dict[str, Tensor]]]:
    todo = [(c, s) for c, s in zip(cases, seeds, strict=True) if (c, s) not in _LOADED]
    if todo:
        root = str(scratch_dir("m09-check"))
        try:
            ranks = run_checked(dcp_reference, WORLD, [c for c, _ in todo],
                                [s for _, s in todo], root,
                                what="the check's own DCP save and load",
                                hang_hint="none of yours: the check's reference hung; run "
                                "the cell again")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for i, (c, s) in enumerate(todo):
            _LOADED[(c, s)] = [ranks[r][i] for r in range(c[1])]
    return [_LOADED[(c, s)] for c, s in zip(cases, seeds, strict=True)]


def _diagnose(case: Case, got: dict, want: list[dict], r: int, key: str) -> str:
    t_old, t_new, dim, shape, _ = case
    n, m = shape[dim] // t_old, shape[dim] // t_new
    if key != "weight" and torch.equal(got["weight"], want[r]["weight"]):
        return (f"your weight is right but not its {key}: Adam's moments are cut exactly like "
                "the weight (the same rows or columns) and must be resharded the same way")
    if any(torch.equal(got[key], w[key]) for i, w in enumerate(want) if i != r):
        return (f"the pieces are out of order: new rank r holds entries r·{m} to (r+1)·{m} "
                f"along dim {dim}, the old pieces in rank order")
    return (f"new piece {r} is entries {r * m}..{(r + 1) * m - 1} of the whole tensor along "
            f"dim {dim}: copy from each old piece k (entries k·{n}..k·{n}+{n - 1}) the part "
            "that overlaps them")


def _shape_hint(case: Case, got: tuple[int, ...], key: str, weight_ok: bool) -> str:
    t_old, t_new, dim, shape, _ = case
    old = list(shape)
    old[dim] //= t_old
    if weight_ok:
        return (f"your weight is right but not its {key}: Adam's moments are cut exactly like "
                "the weight and must be resharded the same way")
    if list(got) == old:
        return (f"that is an old piece's shape: the new pieces are 1/{t_new} of the whole "
                f"along dim {dim}, not 1/{t_old}")
    other = [d for d in range(len(shape)) if d != dim][0]
    if len(got) == len(shape) and got[other] == shape[other]:  # cut along dim, a wrong length
        m = shape[dim] // t_new
        return (f"your piece has {got[dim]} entries along dim {dim}, expected {m} "
                f"({shape[dim]} / t_new = {t_new}): new piece r is entries r·{m} up to, not "
                f"including, (r+1)·{m}, and its overlap with old piece k runs from "
                "max(new start, old start) up to, not including, min(new end, old end)")
    want = list(shape)
    want[dim] //= t_new
    if len(got) == len(shape) and got[other] != shape[other]:  # it changed the other dim
        return (f"cut along dim {dim}, the dim TP split (not dim {other}), into {t_new} equal "
                "pieces")
    return (f"new piece r is the whole tensor {tuple(shape)} cut along dim {dim} into "
            f"{t_new} equal pieces of shape {tuple(want)}; yours is {tuple(got)}")


def _compare(case: Case, got: Any, want: list[dict[str, Tensor]]) -> None:
    t_old, t_new, dim, shape, dtype = case
    name = _name(case)
    expect_type(got, (list, tuple), name=f"reshard(..., t_new={t_new})",
                what=f"a list of {t_new} dicts, one per new rank")
    if len(got) != t_new:
        fail(f"{name}: expected {t_new} pieces (one per new rank), got {len(got)}",
             hint=f"return t_new = {t_new} pieces whatever t_old was; an answer that splits "
             "each old piece in two works only for t 2 -> 4")
    for r, piece in enumerate(got):
        expect_type(piece, dict, name=f"piece {r} of reshard(...)",
                    what=f"a dict with the keys {', '.join(KEYS)}")
        for key in KEYS:
            if not isinstance(piece.get(key), Tensor):
                fail(f"{name}: piece {r} has no tensor under {key!r}",
                     hint=f"every new piece holds the three tensors {', '.join(KEYS)}")
            expected = want[r][key]
            if piece[key].shape != expected.shape:
                fail(f"{name}: new rank {r}'s {key} has shape {tuple(piece[key].shape)}, DCP "
                     f"loads {tuple(expected.shape)}",
                     hint=_shape_hint(case, tuple(piece[key].shape), key,
                                      key != "weight" and torch.equal(piece["weight"],
                                                                      want[r]["weight"])))
            if piece[key].dtype != expected.dtype:
                fail(f"{name}: new rank {r}'s {key} is {piece[key].dtype}, DCP loads "
                     f"{expected.dtype}, the old pieces' dtype",
                     hint="make each new piece with the old pieces' dtype: "
                          "old.new_empty(shape), or torch.empty(shape, dtype=old.dtype); "
                          "torch.zeros(shape) alone makes float32")
            if not torch.equal(piece[key], expected):
                fail(f"{name}: new rank {r}'s {key} differs from what DCP loads for rank {r}",
                     hint=_diagnose(case, piece, want, r, key))
            assert_owns_only(piece[key], name=f"{name}: new rank {r}'s {key}")


@exercise("m09_reshard")
def check_reshard(reshard: Callable[..., Any], *, quiet: bool = False) -> None:
    """reshard(pieces, dim, t_new) -> t_new dicts {weight, exp_avg, exp_avg_sq}, equal to
    what DCP loads on t_new ranks from the t_old pieces saved with dcp.save."""
    not_reexport(reshard, name="reshard")
    cases = CASES + (HIDDEN if quiet else [])
    seeds = [900 + i for i in range(len(cases))]
    answers = []
    for case, seed in zip(cases, seeds, strict=True):  # yours first: a stub fails at once
        pieces = make_pieces(case, seed)
        before = [{k: v.clone() for k, v in p.items()} for p in pieces]
        answers.append(call_learner("reshard", reshard, pieces, case[2], case[1],
                                    refuse=REFUSED, refusal="torch.distributed.checkpoint (or "
                                    "DTensor's redistribute, or parlab's own resharding)"))
        for old, new in zip(before, pieces, strict=True):
            for k in KEYS:
                assert_unchanged(old[k], new[k], name=f"{_name(case)}: pieces[...][{k!r}]")
    for case, got, expected in zip(cases, answers, _reference(cases, seeds), strict=True):
        _compare(case, got, expected)
    if not quiet:
        shown = "; ".join(_name(c) for c in CASES)
        print(f"reshard equals DCP's own load on every new rank, the weight and both moments: "
              f"{shown}; the hidden tests add 4 -> 3, 3 -> 4 and 3 -> 2")
