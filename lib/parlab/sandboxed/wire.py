"""Plain data across the trust boundary: what a learner's process may send the verifier.

A rank or the learner's process turns its result into bytes with `encode`; the verifier reads
them back with `decode`, which is `torch.load(weights_only=True)` (tensors, numbers, strings,
lists, tuples, dicts: nothing that names a class or a function, so nothing runs) and then a
walk that refuses anything else. What `encode` cannot send plainly is refused where it is
made, with a message naming the type; slices travel as {"__slice__": [start, stop, step]},
and the course's own dataclasses and NamedTuples (a `parlab.comm.Event`, a `parlab.pp.Action`)
as {"__dataclass__": "module:name", "fields": {...}}, rebuilt with their own constructor: only
a type defined in a parlab module is, never a learner's class.

`Answer(name)` stands for one of the learner's names in the verifier: calling it asks the
learner's process to call it (parlab.grading.verify.remote binds the caller); sent to a rank,
it is replaced there by what the learner's cells defined under that name.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
from typing import Any

import torch

__all__ = ["MAX_BYTES", "WireError", "Answer", "encode", "decode"]

MAX_BYTES = 64 << 20  # the most one reply may hold
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_SLICE = "__slice__"
_DATACLASS = "__dataclass__"


def _ours(cls: Any) -> bool:
    """A dataclass or a NamedTuple of the course's own (parlab's): plain data."""
    if not isinstance(cls, type) or not str(getattr(cls, "__module__", "")).startswith("parlab."):
        return False
    if issubclass(cls, tuple):
        return hasattr(cls, "_fields")
    return dataclasses.is_dataclass(cls)


def _fields(obj: Any) -> list[str]:
    if isinstance(obj, tuple):
        return list(type(obj)._fields)  # type: ignore[attr-defined]
    return [f.name for f in dataclasses.fields(obj)]


class WireError(TypeError):
    """A value that is not plain data (or bytes that do not decode to plain data)."""


class Answer:
    """The learner's `name`, seen from the verifier; its caller is set by the verifier."""

    caller: Any = None  # (name, args, kwargs) -> result, bound by the verifier's session
    namespace: dict | None = None  # in a rank: what the learner's code defined

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = self.name = name
        self.__module__ = "__main__"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if Answer.namespace is not None and self.name in Answer.namespace:  # in a rank
            return Answer.namespace[self.name](*args, **kwargs)
        if Answer.caller is None:
            raise RuntimeError(f"{self.name} is the learner's; it is not defined here")
        return Answer.caller(self.name, args, kwargs)

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        return (Answer, (self.name,))


def plain(obj: Any, path: str = "result") -> Any:
    """obj as plain data (tensors detached, on the CPU), or WireError naming what is not."""
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise WireError(f"{path} is a {obj.layout} tensor: send a dense one")
        return torch.Tensor(obj.detach().cpu()).clone() if type(obj) is not torch.Tensor \
            else obj.detach().cpu().clone()
    if isinstance(obj, slice):
        return {_SLICE: [plain(obj.start), plain(obj.stop), plain(obj.step)]}
    if _ours(type(obj)):
        fields = {name: plain(getattr(obj, name), f"{path}.{name}") for name in _fields(obj)}
        return {_DATACLASS: f"{type(obj).__module__}:{type(obj).__qualname__}",
                "fields": fields}
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, torch.Size):
        return tuple(int(n) for n in obj)
    if isinstance(obj, (list, tuple)):
        items = [plain(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)  # a learner's NamedTuple too
    if isinstance(obj, dict):
        return {plain(k, f"a key of {path}"): plain(v, f"{path}[{k!r}]") for k, v in obj.items()}
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # a numpy scalar
        return obj.item()
    raise WireError(f"{path} is a {type(obj).__name__}, which the grader cannot read as data: "
                    "return tensors, numbers, strings, and lists, tuples or dicts of them")


def encode(obj: Any) -> bytes:
    """obj as bytes that `decode` accepts (WireError if it is not plain data)."""
    buf = io.BytesIO()
    torch.save(plain(obj), buf)
    return buf.getvalue()


def _check(obj: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise WireError("data nested more than 64 levels deep")
    if isinstance(obj, _SCALARS):
        return obj
    if type(obj) is torch.Tensor:
        return obj
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        items = [_check(v, depth + 1) for v in obj]
        return items if type(obj) is list else tuple(items)
    if type(obj) is dict or (isinstance(obj, dict) and type(obj).__name__ == "OrderedDict"):
        if set(obj) == {_SLICE} and isinstance(obj[_SLICE], list) and len(obj[_SLICE]) == 3:
            return slice(*(_check(v, depth + 1) for v in obj[_SLICE]))
        if set(obj) == {_DATACLASS, "fields"} and isinstance(obj["fields"], dict):
            return _rebuild(obj[_DATACLASS], _check(obj["fields"], depth + 1))
        return {_check(k, depth + 1): _check(v, depth + 1) for k, v in obj.items()}
    raise WireError(f"a {type(obj).__name__} is not plain data")


def _rebuild(name: Any, fields: dict) -> Any:
    """The course's frozen dataclass `name` ("module:qualname") made from plain `fields`."""
    module, _, qualname = str(name).partition(":")
    if not module.startswith("parlab.") or not qualname.isidentifier():
        raise WireError(f"{name!r} is not one of the course's data types")
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        raise WireError(f"{name!r} is not one of the course's data types") from None
    if not _ours(cls):
        raise WireError(f"{name!r} is not one of the course's data types")
    try:
        return cls(**{str(k): v for k, v in fields.items()})
    except TypeError as exc:
        raise WireError(f"a {qualname} cannot be made from what was sent: {exc}") from None


def decode(data: bytes) -> Any:
    """The plain data in `data`; WireError when it holds anything else or is too large."""
    if not isinstance(data, bytes):
        raise WireError(f"expected bytes, got a {type(data).__name__}")
    if len(data) > MAX_BYTES:
        raise WireError(f"{len(data):,} bytes is more than the {MAX_BYTES:,} a reply may hold")
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any failure is "not plain data"
        raise WireError(f"not plain data: {type(exc).__name__}: {str(exc)[:200]}") from None
    return _check(obj)
