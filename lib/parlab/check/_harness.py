"""How every graded check runs learner code: one call wrapper, one rank runner, one refusal.

- `call_learner(stage, fn, *args)`: call the learner's code (in a rank or in the kernel); a
  crash becomes `CheckFailed` naming the stage and the rank, with the learner's own frames
  (and, for a collective's list of the wrong length, to read the world size).
  `refuse=` names references the answer must not use while it runs (`parlab.errors.refused`).
- `run_checked(worker, world_size, ...)`: run a check's worker on ranks through
  `parlab.launch.run` with a timeout well below nbgrader's cell timeout. A hang becomes
  `CheckFailed` saying what did not finish, what each rank was doing and the likely mistake; a
  `CheckFailed` raised in a rank comes back as that rank's message.
- `refuse_in_rank(references, what)`: for the rest of a rank's short life, the references
  raise `CheckFailed` (a rank is a process of its own, started for one check).
- `not_reexport` / `not_reference`: the same refusal, before anything runs, for an answer
  that IS the course's reference (a re-export, or a subclass of it).
- `on_learner_side(fn, *args)`: a check's own function that must run where the learner's code
  lives (it calls an answer, runs backward through its graph, measures what it keeps): here
  in a notebook, in the learner's stand-in under the verifier (parlab.grading.verify); what
  it returns is plain data.
- `exercise(key, needs=...)`: record whether a check passed in this kernel; when it fails and
  a check it builds on failed earlier, say so first ("fix exercise 1 first").
- In a rank: `env()` is (rank, world size, this rank's device: its GPU under NCCL, else the
  CPU), and `cpu(x)` a result's tensor as it goes back to the kernel (detached, on the CPU).
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from parlab import launch
from parlab.check._compare import fail
from parlab.errors import CheckFailed, NotWritten, Readable, reference_message, refused

__all__ = ["CHECK_TIMEOUT_S", "SHAPE_ERRORS", "WORLD_ERRORS", "TRUSTED_KEYS", "ranks",
           "run_checked", "call_learner", "refuse_in_rank", "not_reexport", "not_reference",
           "on_learner_side", "exercise", "reset_outcomes", "env", "cpu"]

CHECK_TIMEOUT_S = 20.0  # launcher timeout of a graded check; nbgrader's cell timeout is 60 s
SHAPE_ERRORS = ("size of tensor", "shapes cannot be", "must match the size", "shape '[",
                "Sizes of tensors must match", "invalid gradient", "tensor list size")
"""Phrases of torch's errors when tensors do not fit: a learner's shard or layout is off."""
WORLD_ERRORS = ("invalid output tensor list", "invalid input tensor list",
                "number of collective participants")
"""Phrases of gloo's and NCCL's errors when a collective's list of tensors does not hold one
per rank: the world size written in."""
WORLD_HINT = ("a collective's list holds one tensor per rank: read W from "
              "dist.get_world_size(), never a number (the check ran on {world} ranks)")
F = TypeVar("F", bound=Callable[..., Any])
TRUSTED_KEYS = frozenset({"ref", "column_row"})
"""Keys of a worker's result that hold the reference's values, computed in the rank: the
verifier takes them from its own trusted run, never from a rank that ran learner code."""


def _rank() -> int | None:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def env() -> tuple[int, int, Any]:
    """In a rank: (rank, world size, this rank's device: its GPU under NCCL, else the CPU)."""
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size(), launch.device()


def cpu(x: Any) -> Any:
    """A tensor of a rank's result as it goes back to the kernel: detached, a copy, on the CPU
    (anything else as it is)."""
    import torch

    return x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x


def call_learner(stage: str, fn: Callable[..., Any], *args: Any, hint: str | None = None,
                 shape_hint: str | None = None, refuse: Iterable[object] = (),
                 refusal: str = "the course's reference") -> Any:
    """Run learner code; a crash becomes CheckFailed naming the stage and the rank, with
    `hint`, or `shape_hint` when torch says tensors do not fit. A stub's NotImplementedError
    (raised by the learner's own code, not torch's) and a CheckFailed pass through as they
    are. Inside the call, `refuse` raise CheckFailed."""
    try:
        with refused(refuse, reference_message(refusal)):
            return fn(*args)
    except CheckFailed:
        raise
    except Exception as exc:
        if NotWritten.is_stub(exc):  # the release's stub: not a wrong answer
            raise  # noqa: BLE001 - reported to the learner
        text = str(exc)
        rank = _rank()
        if hint is None and rank is not None and any(s in text for s in WORLD_ERRORS):
            hint = WORLD_HINT.format(world=_world())
        if hint is None and shape_hint and any(s in text for s in SHAPE_ERRORS):
            hint = "a shape does not fit; " + shape_hint
        fail(f"{stage} raised {type(exc).__name__}: {text}", rank=rank,
             hint=hint or "read the error and your code below; the check ran it on "
             + (f"{_world()} ranks" if rank is not None else "one process"))


def on_learner_side(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), in the learner's process when the verifier runs this check (an
    argument stands for one of the learner's names there); fn is a check's module-level
    function and returns plain data (tensors, numbers, lists, dicts)."""
    from parlab.sandboxed import wire

    if wire.Answer.caller is not None and any(isinstance(a, wire.Answer)
                                              for a in (*args, *kwargs.values())):
        return wire.Answer.caller(fn, args, kwargs)
    return fn(*args, **kwargs)


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


_IN_RANK: list[Any] = []  # the refusals entered by refuse_in_rank, kept open (never exited)


def refuse_in_rank(references: Iterable[object], what: str) -> None:
    """Refuse `references` (functions, classes) for the rest of this rank's life."""
    block = refused(list(references), reference_message(what))
    block.__enter__()
    _IN_RANK.append(block)  # a dropped generator would close itself and lift the refusal


def ranks(worker: Callable[..., Any], world_size: int, *args: Any,
          timeout: float = CHECK_TIMEOUT_S, **kwargs: Any) -> list:
    """Run a check's worker on `world_size` ranks (see parlab.launch.run)."""
    return launch.run(worker, world_size, *args, timeout=timeout, **kwargs)


def run_checked(worker: Callable[..., Any], world_size: int, *args: Any, what: str,
                timeout: float = CHECK_TIMEOUT_S, hang_hint: str,
                backend: str | None = None) -> list:
    """`ranks`, for checks: a hang or a CheckFailed in a rank becomes CheckFailed; other rank
    errors (the learner's own exception, a mismatched collective) pass through."""
    try:
        return launch.run(worker, world_size, *args, timeout=timeout, backend=backend)
    except launch.CollectiveTimeout as exc:
        raise CheckFailed(f"{what} did not finish on {world_size} ranks: {exc}\n"
                          f"Likely mistake: {hang_hint}") from None
    except launch.RankError as exc:
        if exc.exc_type != "CheckFailed":
            raise
        report = next((r for r in exc.reports if r[0] == exc.rank), None)
        raise CheckFailed(report[2] if report else str(exc),
                          learner_traceback=exc.traceback) from None


def not_reexport(fn: Callable[..., Any], *, name: str) -> None:
    """Reject an answer that only hands back parlab's own reference implementation."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", "") or ""
    if module == "parlab" or module.startswith("parlab."):
        fail(reference_message(f"{module}.{getattr(target, '__qualname__', name)} as {name}"))


def not_reference(obj: Any, *, name: str, modules: tuple[str, ...], advice: str = "") -> None:
    """`not_reexport`, and no subclass of a class defined in `modules` (the course's own)."""
    not_reexport(obj, name=name)
    for base in getattr(obj, "__mro__", ())[1:]:
        module = getattr(base, "__module__", "") or ""
        if module.startswith(modules):
            fail(reference_message(f"{module}.{base.__name__} (your {name} subclasses it)")
                 + advice)


_OUTCOMES: dict[str, bool] = {}  # exercise key -> did its check pass, in this kernel


def reset_outcomes() -> None:
    """Forget every recorded outcome (a fresh kernel; tests call it between cases)."""
    _OUTCOMES.clear()


def _unwritten(exc: BaseException) -> bool:
    """The learner has not written this answer yet: the release's stub raised, here or in a
    rank."""
    return NotWritten.is_stub(exc) or bool(getattr(exc, "unwritten", False))


def exercise(key: str, *, needs: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Decorate a check: remember its outcome under `key`; when it fails while a check in
    `needs` (key -> what the learner wrote there, e.g. "f and g (exercise 1)") failed earlier
    in this kernel, the message starts by saying so."""
    def wrap(check: F) -> F:
        @functools.wraps(check)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                result = check(*args, **kwargs)
            except Exception as exc:
                if _unwritten(exc):  # a stub: nothing was judged, so nothing is recorded
                    _OUTCOMES.pop(key, None)
                    if isinstance(exc, NotImplementedError) and not isinstance(exc, Readable):
                        raise NotWritten.of(exc) from None  # the stub's line, not our frames
                    raise
                _OUTCOMES[key] = False
                earlier = [what for k, what in (needs or {}).items() if _OUTCOMES.get(k) is False]
                if not earlier:
                    raise
                summary = exc.summary() if hasattr(exc, "summary") else str(exc)
                note = (f"this check builds on your {' and '.join(earlier)}, which failed "
                        "its own test above: fix that first, then run this cell again.")
                raise CheckFailed(f"{note}\n{type(exc).__name__}: {summary}",
                                  learner_traceback=getattr(exc, "learner_traceback", "")
                                  or "".join(traceback.format_tb(exc.__traceback__))) from exc
            _OUTCOMES[key] = True
            return result
        return checked  # type: ignore[return-value]
    return wrap
