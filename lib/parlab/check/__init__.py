"""What notebook test cells call: compare a learner's result with a reference, and say why not.

A failed check raises `CheckFailed` (an AssertionError, so nbgrader scores the cell 0) with a
message a learner can act on: which rank, which tensor, expected against got, and the likely
mistake. Module-specific checks live beside this file (`parlab.check.collectives`, ...);
they run the learner's code on several ranks through `ranks()`, whose timeout is well below
nbgrader's cell timeout, so a deadlocked answer fails its own test and the rest still grade.

Tolerances: float32 results that only differ in summation order agree to about 1e-6
relative; we allow `rtol=1e-5, atol=1e-6` unless a check states otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from parlab import launch

CHECK_TIMEOUT_S = 20.0  # launcher timeout of a graded check; nbgrader's cell timeout is 60 s
RTOL, ATOL = 1e-5, 1e-6


class CheckFailed(AssertionError):
    """A learner's answer disagrees with the reference; the message says how."""


def fail(message: str, *, rank: int | None = None, hint: str | None = None) -> None:
    where = f"rank {rank}: " if rank is not None else ""
    text = where + message + (f"\nLikely mistake: {hint}" if hint else "")
    raise CheckFailed(text)


def assert_close(got: Any, expected: torch.Tensor, *, name: str, rank: int | None = None,
                 rtol: float = RTOL, atol: float = ATOL, hint: str | None = None) -> None:
    """Fail unless `got` is a tensor of `expected`'s shape and values (within tolerance)."""
    if not isinstance(got, torch.Tensor):
        fail(f"{name} should be a tensor of shape {tuple(expected.shape)}, got "
             f"{type(got).__name__}", rank=rank, hint=hint or "return the tensor you computed")
    if got.shape != expected.shape:
        fail(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}",
             rank=rank, hint=hint)
    got_f, exp_f = got.detach().double().cpu(), expected.detach().double().cpu()
    bad = ~torch.isclose(got_f, exp_f, rtol=rtol, atol=atol, equal_nan=False)
    if bool(bad.any()):
        diff = (got_f - exp_f).abs().masked_fill(~bad, 0)
        idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
        fail(f"{name} differs from the reference in {int(bad.sum())} of {bad.numel()} "
             f"entries; worst at index {idx}: expected {exp_f[idx].item():.6g}, got "
             f"{got_f[idx].item():.6g} (tolerance rtol={rtol:g}, atol={atol:g})",
             rank=rank, hint=hint)


def assert_equal(got: Any, expected: Any, *, name: str, rank: int | None = None,
                 hint: str | None = None) -> None:
    """Exact comparison for numbers, strings and tuples."""
    if got != expected:
        fail(f"{name}: expected {expected!r}, got {got!r}", rank=rank, hint=hint)


SHAPE_ERRORS = ("size of tensor", "shapes cannot be", "must match the size", "shape '[",
                "Sizes of tensors must match", "invalid gradient", "tensor list size")
"""Phrases of torch's errors when tensors do not fit: a learner's shard or layout is off."""


def call_in_rank(stage: str, fn: Callable[..., Any], *args: Any, hint: str | None = None,
                 shape_hint: str | None = None) -> Any:
    """Run learner code in a rank; a crash becomes CheckFailed naming the rank and the stage,
    with `hint`, or `shape_hint` when torch says tensors do not fit. A stub's
    NotImplementedError and a CheckFailed pass through as they are."""
    try:
        return fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        import torch.distributed as dist

        text = str(exc)
        if hint is None and shape_hint and any(s in text for s in SHAPE_ERRORS):
            hint = "a shape does not fit; " + shape_hint
        fail(f"{stage} raised {type(exc).__name__}: {text}", rank=dist.get_rank(),
             hint=hint or "read the error above; try your code on 2 ranks with "
                          "parlab.launch.run(..., world_size=2) to see it fail")


def not_reexport(fn: Callable[..., Any], *, name: str) -> None:
    """Reject an answer that only hands back parlab's own reference implementation."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", "") or ""
    if module == "parlab" or module.startswith("parlab."):
        fail(f"{name} is {module}.{getattr(target, '__qualname__', name)}, the course's own "
             "reference; the exercise is to write it yourself")


_REFUSAL: list[str] = []  # what a blocked reference says while `blocked_reference` is active


def _refuse(*args: Any, **kwargs: Any) -> Any:
    """Its code replaces a reference function's: it runs with that function's globals, so it
    names nothing of this module's namespace directly."""
    from parlab.check import _REFUSAL as said
    from parlab.check import CheckFailed as Failed

    raise Failed(said[-1])


@contextlib.contextmanager
def blocked_reference(functions: Iterable[Callable[..., Any]], message: str) -> Iterator[None]:
    """Inside the block, each of `functions` raises CheckFailed(message).

    Their code objects are swapped rather than their names rebound, so an answer that reached
    them through an alias, a wrapper or a subclass is refused too. Functions with closures
    cannot be swapped (Python refuses); pass plain functions and methods.
    """
    saved = [(fn, fn.__code__) for fn in functions]
    _REFUSAL.append(message)
    for fn, _ in saved:
        fn.__code__ = _refuse.__code__
    try:
        yield
    finally:
        for fn, code in saved:
            fn.__code__ = code
        _REFUSAL.pop()


def not_reference(obj: Any, *, name: str, modules: tuple[str, ...], advice: str = "") -> None:
    """`not_reexport`, and no subclass of a class defined in `modules` (the course's own)."""
    not_reexport(obj, name=name)
    for base in getattr(obj, "__mro__", ())[1:]:
        module = getattr(base, "__module__", "") or ""
        if module.startswith(modules):
            fail(f"{name} subclasses {module}.{base.__name__}, the course's own reference; "
                 f"the exercise is to write it yourself{advice}")


def ranks(worker: Callable[..., Any], world_size: int, *args: Any,
          timeout: float = CHECK_TIMEOUT_S, **kwargs: Any) -> list:
    """Run a check's worker on `world_size` ranks (see parlab.launch.run)."""
    return launch.run(worker, world_size, *args, timeout=timeout, **kwargs)


def run_checked(worker: Callable[..., Any], world_size: int, *args: Any, what: str,
                timeout: float, hang_hint: str, backend: str | None = None) -> list:
    """`ranks`, for checks: a hang becomes CheckFailed saying what did not finish, what each
    rank was doing and `hang_hint`; a CheckFailed raised in a rank comes back as that rank's
    message, without the rank's traceback around it. Other rank errors pass through."""
    try:
        return ranks(worker, world_size, *args, timeout=timeout, backend=backend)
    except launch.CollectiveTimeout as exc:
        raise CheckFailed(f"{what} did not finish on {world_size} ranks within {timeout:g} s."
                          f"\n{exc}\nLikely mistake: {hang_hint}") from None
    except launch.RankError as exc:
        if exc.exc_type != "CheckFailed":
            raise
        report = next((r for r in exc.reports if r[0] == exc.rank), None)
        raise CheckFailed(report[2] if report else str(exc)) from None
