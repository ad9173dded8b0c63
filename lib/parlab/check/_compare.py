"""Comparisons that fail with a message a learner can act on.

Every helper raises `CheckFailed` (see `parlab.errors`) naming the rank, the tensor, expected
against got, and, when given, the likely mistake. Tolerances: float32 results that only differ
in summation order agree to about 1e-6 relative; the default is `rtol=1e-5, atol=1e-6`.

On a GPU the same tolerances hold: ranks and references run with TF32 off
(`parlab.launch.devices.pin_numerics`; with it a float32 product keeps 10 bits of mantissa,
~5e-4 relative, and every float32 check would fail), and what is left is the order of
additions (cuBLAS's split of a matmul's sums, NCCL's order in a ring), ~1e-7 relative per
rounding as on the CPU. float64 checks (rtol=1e-10) allow for the same reorderings at
float64's ~1e-16.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import torch
from torch import nn

from parlab.errors import LIKELY, CheckFailed

__all__ = ["RTOL", "ATOL", "fail", "assert_close", "assert_equal", "assert_owns_only",
           "assert_unchanged", "expect_type", "randomize_parameters"]

RTOL, ATOL = 1e-5, 1e-6


def fail(message: str, *, rank: int | None = None, hint: str | None = None) -> NoReturn:
    """Raise CheckFailed("rank r: message\\nLikely mistake: hint")."""
    where = f"rank {rank}: " if rank is not None else ""
    raise CheckFailed(where + message + (f"\n{LIKELY} {hint}" if hint else ""))


def assert_close(got: Any, expected: torch.Tensor, *, name: str, rank: int | None = None,
                 rtol: float = RTOL, atol: float = ATOL, hint: str | None = None) -> None:
    """Fail unless `got` is a tensor of `expected`'s shape and values (within tolerance).

    NaN or infinity where the reference is finite gets a message of its own (a softmax over a
    fully masked row, a division by zero), so does a dtype that cannot hold the values."""
    if not isinstance(got, torch.Tensor):
        fail(f"{name} should be a tensor of shape {tuple(expected.shape)}, got "
             f"{type(got).__name__}", rank=rank, hint=hint or "return the tensor you computed")
    if got.shape != expected.shape:
        fail(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}",
             rank=rank, hint=hint)
    got_f, exp_f = got.detach().double().cpu(), expected.detach().double().cpu()
    broken = ~torch.isfinite(got_f) & torch.isfinite(exp_f)
    if bool(broken.any()):
        idx = tuple(int(i) for i in torch.nonzero(broken)[0])
        what = (f"{name} is {got_f.item()}, expected {exp_f.item():.8g}" if exp_f.dim() == 0
                else f"{name} holds {int(broken.sum())} NaN or infinite entries of "
                f"{broken.numel()}, first at index {idx} (got {got_f[idx].item()}, expected "
                f"{exp_f[idx].item():.6g})")
        fail(what, rank=rank, hint=hint or "a NaN usually comes from exp(-inf - (-inf)) or "
             "0/0: a row whose scores are all masked, or a maximum taken over nothing")
    bad = ~torch.isclose(got_f, exp_f, rtol=rtol, atol=atol, equal_nan=True)
    if bool(bad.any()) and exp_f.dim() == 0:  # one number: no entries, no index
        g, e = got_f.item(), exp_f.item()
        fail(f"{name} is {g:.8g}, expected {e:.8g}: off by {g - e:+.3g} ({_relative(g, e)}; "
             f"tolerance rtol={rtol:g}, atol={atol:g})", rank=rank, hint=hint)
    if bool(bad.any()):
        diff = (got_f - exp_f).abs().nan_to_num(posinf=1e300).masked_fill(~bad, -1)
        idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
        fail(f"{name} differs from the reference in {int(bad.sum())} of {bad.numel()} "
             f"entries; worst at index {idx}: expected {exp_f[idx].item():.6g}, got "
             f"{got_f[idx].item():.6g} (tolerance rtol={rtol:g}, atol={atol:g})",
             rank=rank, hint=hint)


def _relative(got: float, expected: float) -> str:
    """'2.5% of the expected value', or 'got/expected = -1' where a ratio reads better."""
    if expected == 0:
        return "the expected value is 0"
    ratio = got / expected
    if abs(ratio - 1) < 0.5:
        return f"{100 * abs(got - expected) / abs(expected):.3g}% of the expected value"
    return f"got/expected = {ratio:.4g}"


def assert_equal(got: Any, expected: Any, *, name: str, rank: int | None = None,
                 hint: str | None = None) -> None:
    """Exact comparison for numbers, strings and tuples."""
    if got != expected:
        fail(f"{name}: expected {expected!r}, got {got!r}", rank=rank, hint=hint)


def expect_type(value: Any, kind: type | tuple[type, ...], *, name: str, what: str,
                rank: int | None = None) -> None:
    """Fail, saying what was expected, unless `value` is a `kind` (never a TypeError later)."""
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in (
            kind if isinstance(kind, tuple) else (kind,)):
        fail(f"{name} returned {type(value).__name__} ({value!r:.60}), expected {what}",
             rank=rank, hint=f"return {what}")


def assert_owns_only(tensor: Any, *, name: str, rank: int | None = None,
                     hint: str | None = None) -> None:
    """Fail when `tensor` is a view into a larger storage: a shard must not keep the whole
    parameter alive (slicing a full weight and keeping the slice does exactly that)."""
    if not isinstance(tensor, torch.Tensor):
        return
    own = tensor.numel() * tensor.element_size()
    held = tensor.untyped_storage().nbytes()
    if held > own:
        fail(f"{name} is a view of a {held:,}-byte storage but holds only {own:,} bytes: this "
             f"rank keeps {held / max(own, 1):.3g}x the memory of its shard alive",
             rank=rank, hint=hint or "copy the slice into its own storage, e.g. "
             "`full[a:b].clone()` (or `.contiguous()` of a non-contiguous slice), so the full "
             "tensor can be freed")


def assert_unchanged(before: torch.Tensor, after: Any, *, name: str, rank: int | None = None,
                     hint: str | None = None) -> None:
    """Fail when the learner's code modified an input it was promised to leave alone."""
    if isinstance(after, torch.Tensor) and not torch.equal(before, after.detach().cpu()):
        fail(f"your code modified its input {name} in place", rank=rank,
             hint=hint or "work on a copy (x.clone()) or use out-of-place operations "
             "(x = x + y, not x += y): the caller still needs its tensor")


def randomize_parameters(modules: nn.Module | Iterable[nn.Module], *, seed: int) -> None:
    """Give every parameter random values (LayerNorm weights and every bias included), so a
    parameter left at its default initialisation cannot hide a mistake: a fresh LayerNorm's
    weight is all ones and its bias all zeros, which any LayerNorm matches."""
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in mods:
            for p in module.parameters():
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                scale = p.detach().double().std().item() if p.numel() > 1 else 0.0
                p.copy_((p.double() + noise.to(p.device) * max(scale, 0.2)).to(p.dtype))
