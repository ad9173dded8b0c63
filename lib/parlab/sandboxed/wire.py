"""Plain data across the trust boundary: what a learner's process may send the verifier.

A rank or the learner's process turns its result into bytes with `encode`; the verifier reads
them back with `decode`, which is `torch.load(weights_only=True)` (tensors, numbers, strings,
lists, tuples, dicts: nothing that names a class or a function, so nothing runs) and then a
walk that refuses anything else. What `encode` cannot send plainly is refused where it is
made, with a message naming the type; slices travel as {"__slice__": [start, stop, step]},
and the course's own dataclasses and NamedTuples (a `parlab.comm.Event`, a `parlab.pp.Action`)
as {"__dataclass__": "module:name", "fields": {...}}, rebuilt with their own constructor: only
a type defined in a parlab module is, never a learner's class. A tensor that is a view into a
larger storage travels as {"__view__": its values, "held": the storage's bytes} and comes back
in a storage that large, so a check of what a shard keeps alive reads the same here.

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

__all__ = ["MAX_BYTES", "WireError", "Answer", "describe", "plain", "encode", "decode"]

MAX_BYTES = 64 << 20  # the most one reply may hold
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_SLICE = "__slice__"
_DATACLASS = "__dataclass__"
_VIEW = "__view__"


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

    def __init__(self, name: str, *, module: str = "__main__", qualname: str = "",
                 bases: tuple = ()) -> None:
        self.__name__ = self.name = name
        self.__qualname__ = qualname or name
        self.__module__ = module  # where the learner's object says it was defined: a check
        # that refuses a re-export of the course's reference reads it (and `__mro__`)
        if bases:
            self.__mro__ = (self, *(_Named(m, n) for m, n in bases))

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


class _Named:
    """A base class of a learner's class, as a check's refusal reads it: module and name."""

    def __init__(self, module: str, name: str) -> None:
        self.__module__, self.__name__ = module, name


def describe(obj: Any) -> dict[str, Any]:
    """What a check may read of a learner's callable without calling it: where it (or what it
    wraps) was defined, and the bases of a class."""
    target = getattr(obj, "__wrapped__", obj)
    out: dict[str, Any] = {"module": str(getattr(target, "__module__", "") or ""),
           "qualname": str(getattr(target, "__qualname__", "") or "")}
    if isinstance(obj, type):
        out["bases"] = [(str(b.__module__), str(b.__name__)) for b in obj.__mro__[1:]]
    return out


def _tensor(t: torch.Tensor, path: str) -> Any:
    """A dense tensor as plain data; a view into a larger storage says how much it holds, so
    that a check of what a shard keeps alive reads the same on the other side."""
    if t.layout != torch.strided or t.is_quantized:
        raise WireError(f"{path} is a {t.layout} tensor: send a dense one")
    out = torch.Tensor(t.detach().cpu()).clone() if type(t) is not torch.Tensor \
        else t.detach().cpu().clone()
    held = t.untyped_storage().nbytes()
    if held > t.numel() * t.element_size():
        return {_VIEW: out, "held": int(held)}
    return out


def _held(t: Any, held: Any) -> torch.Tensor:
    """`t` copied into a storage of `held` bytes (at most MAX_BYTES), as it was sent."""
    if type(t) is not torch.Tensor or not isinstance(held, int):
        raise WireError("a view is sent as a tensor and the bytes it held")
    size = t.element_size()
    n = max(t.numel(), min(held, MAX_BYTES) // max(size, 1))
    out = torch.empty(n, dtype=t.dtype)[: t.numel()].view(t.shape)
    out.copy_(t)
    return out


def plain(obj: Any, path: str = "result") -> Any:
    """obj as plain data (tensors detached, on the CPU), or WireError naming what is not."""
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, torch.Tensor):
        return _tensor(obj, path)
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
        if set(obj) == {_VIEW, "held"}:
            return _held(obj[_VIEW], obj["held"])
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
