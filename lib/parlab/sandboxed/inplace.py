"""What a call of the learner's code changed in place, carried back across the trust boundary.

A check may hand the learner's function a tensor, a list or a dict and then look whether it
is still as it was (`assert_unchanged`, a list of costs turned into prefix sums). Under the
verifier the call runs in the learner's process, on copies: there, `snapshot` the arguments
before the call and `changes` after it gives what differs, as plain data; here, `apply`
makes the same change to the check's own objects (in place: the check holds them).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["snapshot", "changes", "apply", "update"]


def _mutable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or type(value) in (list, dict, tuple)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(_copy(v) for v in value)
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    return value  # a number, a string, or an object compared by identity


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype and bool(a.equal(b.detach())))
    if type(a) in (list, tuple) or type(b) in (list, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if type(a) is dict or type(b) is dict:
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    with contextlib.suppress(Exception):
        return a is b or bool(a == b)
    return False


def _by_key(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by position ("0", "1", ...) or keyword."""
    return {str(k): v for k, v in [*enumerate(args), *kwargs.items()]}


def snapshot(args: tuple, kwargs: dict) -> dict[str, Any]:
    """Copies of the arguments a call could change in place, by position or keyword."""
    return {k: _copy(v) for k, v in _by_key(args, kwargs).items() if _mutable(v)}


def changes(before: dict[str, Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments that differ from `before` after the call, as they are now."""
    now = _by_key(args, kwargs)
    return {k: now[k] for k, old in before.items() if not _same(old, now[k])}


def apply(changed: dict[str, Any], args: tuple, kwargs: dict) -> None:
    """`changes` (made in another process) made to this call's own arguments, in place."""
    mine = _by_key(args, kwargs)
    for key, new in changed.items():
        if key in mine:
            update(mine[key], new)


def update(mine: Any, new: Any) -> None:
    """Make `mine` (a tensor, list, dict or tuple) equal to `new`, in place, item by item, so
    that whoever holds `mine` or one of its items sees the change."""
    if isinstance(mine, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if mine.shape == new.shape and mine.dtype == new.dtype:
                mine.copy_(new)
            else:
                mine.set_(new.clone().to(mine.dtype))  # type: ignore[call-overload]
    elif type(mine) is list and isinstance(new, list) and len(mine) != len(new):
        mine[:] = new
    elif type(mine) in (list, tuple) and isinstance(new, (list, tuple)):
        for i, (a, b) in enumerate(zip(mine, new, strict=False)):
            if _mutable(a):
                update(a, b)
            elif type(mine) is list:
                mine[i] = b
    elif type(mine) is dict and isinstance(new, dict):
        for k in [k for k in mine if k not in new]:
            del mine[k]
        for k, v in new.items():
            if k in mine and _mutable(mine[k]):
                update(mine[k], v)
            else:
                mine[k] = v
