"""The verifier's side inside a submission's sandbox: run learner code, send back plain data.

The verifier starts a fresh sandboxed kernel for a submission (parlab.grading.verify.remote)
and sends it requests with `handle`. The kernel runs none of the learner's code itself; it
starts the processes that do:

- "run": `parlab.launch.run` of a check's worker on ranks that first run the learner's code
  (`learner_rank`): the worker's arguments that are `Answer`s become what the learner's code
  defined under those names, and the result goes back encoded as plain data (`wire`);
- "call" / "values": the learner's stand-in for the notebook's kernel (`serve_learner`, one
  process, started once): call one of the learner's functions (under the check's refusals;
  the arguments it changed in place come back too, `inplace`), or read the values of its
  names, all in one request (of a callable: where it says it was defined, `wire.describe`).

Every reply is printed as one line, MARK followed by base64 of `wire` bytes; a failure is
sent as data too ({"error": kind, ...}), and the verifier turns it back into the exception the
check would have seen in the notebook.
"""

from __future__ import annotations

import base64
import traceback
from typing import Any

import cloudpickle

from parlab.sandboxed import wire

__all__ = ["MARK", "handle", "named", "found", "learner_rank",
           "serve_learner", "run_source", "resolve"]

MARK = "@@parlab-verify@@"
CALL_TIMEOUT_S = 15.0  # one call of a learner's function from a test (a cell's timeout)
_STATE: dict[str, Any] = {}


def run_source(source: str, ns: dict[str, Any] | None = None,
               filename: str = "<answer cell>") -> dict[str, Any]:
    """The namespace `source` leaves (in `ns`, or a fresh __main__), run statement by
    statement as a notebook would (one failing does not stop the next)."""
    import ast

    ns = {"__name__": "__main__", "__builtins__": __builtins__} if ns is None else ns
    for stmt in ast.parse(source).body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec")
        try:
            exec(code, ns)  # noqa: S102 - learner code only in its sandboxed processes
        except Exception:  # noqa: BLE001, S110 - as in a notebook, the next cell still runs
            pass
    return ns


def resolve(obj: Any, ns: dict[str, Any]) -> Any:
    """obj with every Answer (at the top, or in a list, tuple or dict) replaced by ns's."""
    if isinstance(obj, wire.Answer):
        if obj.name not in ns:
            raise NameError(f"name '{obj.name}' is not defined: its answer cell did not define "
                            "it (or raised before it did)")
        return ns[obj.name]
    if type(obj) in (list, tuple):  # not a NamedTuple: its fields hold no Answer
        return type(obj)(resolve(v, ns) for v in obj)
    if type(obj) is dict:
        return {k: resolve(v, ns) for k, v in obj.items()}
    return obj


def learner_rank(source: str, mode: str, fn: Any, args: tuple, kwargs: dict) -> bytes:
    """In a rank: run `source`, then fn(*args, **kwargs) with the Answers resolved; the result
    as `wire` bytes. mode: parlab.sandboxed.MODE for this rank ("learner" or
    "trusted": what a check's helpers do differently when the verifier runs them)."""
    import parlab.sandboxed

    parlab.sandboxed.MODE = mode
    ns = wire.Answer.namespace = run_source(source)  # an Answer deeper in args calls into it
    result = fn(*resolve(args, ns), **resolve(kwargs, ns))
    return wire.encode(result)


def _error(exc: BaseException) -> dict[str, Any]:
    """An exception as data, with what the verifier needs to raise its like again."""
    out: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc),
                           "traceback": getattr(exc, "learner_traceback", "") or
                           "".join(traceback.format_exception(exc)[-6:])}
    for attr in ("rank", "exc_type", "head", "certain", "elapsed"):
        if hasattr(exc, attr):
            out[attr] = getattr(exc, attr)
    if hasattr(exc, "reports"):
        out["reports"] = [tuple(str(x) if i else int(x) for i, x in enumerate(r[:4])) +
                          (float(r[4]),) for r in exc.reports]
    if hasattr(exc, "states"):
        out["states"] = {}
    return out


def named(ref: Any) -> tuple[str, str, bool] | None:
    """Where a refused function or class is found by name: (module, qualname, the function
    that name wraps (`__wrapped__`) rather than the name's own); None when it is not."""
    module, qualname = getattr(ref, "__module__", None), getattr(ref, "__qualname__", "")
    try:
        obj = found(module, qualname, False)
    except (ImportError, AttributeError, TypeError):
        return None
    if obj is ref or getattr(obj, "__wrapped__", None) is ref:
        return str(module), str(qualname), obj is not ref
    return None


def found(module: Any, qualname: str, wrapped: bool) -> Any:
    """The object `named` describes, looked up here."""
    import importlib

    obj = importlib.import_module(str(module))
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.__wrapped__ if wrapped else obj


def _call(obj: Any, args: tuple, kwargs: dict, refusing: list) -> dict[str, Any]:
    """obj(*args, **kwargs) under the check's refusals; the value, and the arguments it
    changed in place, as they are now (the verifier changes its own the same way)."""
    import contextlib

    from parlab.errors import refused
    from parlab.sandboxed import inplace

    before = inplace.snapshot(args, kwargs)
    with contextlib.ExitStack() as stack:
        for names, message in refusing:
            stack.enter_context(refused([found(*n) for n in names], message))
        value = obj(*args, **kwargs)
    reply = {"value": value}
    if changed := inplace.changes(before, args, kwargs):
        with contextlib.suppress(wire.WireError):  # a changed object that is not data
            wire.plain(changed)
            reply["changed"] = changed
    return reply


def _about(name: str, ns: dict[str, Any]) -> dict[str, Any]:
    """The learner's `name`: its value if plain data, what it says it is if callable."""
    try:
        obj = resolve(wire.Answer(name), ns)
        reply = {"callable": wire.describe(obj)} if callable(obj) else {"value": obj}
        wire.plain(reply)
        return reply
    except Exception as exc:  # noqa: BLE001 - this name is then an Answer, tests fail on it
        return _error(exc)


def serve_learner(source: str, conn: Any) -> None:
    """The learner's stand-in for the kernel: answer (kind, name, args, kwargs, refusing)
    requests: the values of a list of names (or what each callable is), or a call under the
    check's refusals."""
    ns = wire.Answer.namespace = run_source(source)
    while True:
        try:
            kind, name, args, kwargs, refusing = conn.recv()
        except EOFError:
            return
        try:
            if kind == "values":
                reply = {"values": {n: _about(n, ns) for n in name}}
            else:  # a check's own function (parlab.check._harness.on_learner_side), or
                obj = name if callable(name) else resolve(wire.Answer(name), ns)  # a name
                reply = _call(obj, resolve(args, ns), resolve(kwargs, ns), refusing)
            data = wire.encode(reply)
        except Exception as exc:  # noqa: BLE001 - sent to the verifier as data
            data = wire.encode(_error(exc))
        conn.send_bytes(data)


def _learner_process() -> Any:
    from parlab.launch.runner import _context

    proc = _STATE.get("proc")
    if proc is None or not proc[0].is_alive():
        ctx = _context()
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=serve_learner, args=(_STATE["source"], theirs), daemon=True)
        p.start()
        theirs.close()
        _STATE["proc"] = proc = (p, mine)
    return proc


def _ask(kind: str, name: str, args: tuple, kwargs: dict, refusing: list,
         timeout: float) -> bytes:
    p, conn = _learner_process()
    conn.send((kind, name, args, kwargs, refusing))
    if conn.poll(timeout):
        try:
            return conn.recv_bytes()
        except EOFError:
            pass
    alive = p.is_alive()
    p.kill()
    p.join(5)
    _STATE.pop("proc", None)
    why = (f"did not return within {timeout:.0f} s" if alive else
           f"ended its process (exit code {p.exitcode})")
    what = f"{name}(...)" if isinstance(name, str) else "your code, called by the check,"
    return wire.encode({"error": "CheckFailed", "message": f"{what} {why}"})


def _run(fn: Any, world_size: int, args: tuple, kwargs: dict, options: dict) -> bytes:
    from parlab.launch.runner import run

    try:
        ranks = run(learner_rank, world_size, _STATE["source"], "learner", fn, args, kwargs,
                    **options)
    except Exception as exc:  # noqa: BLE001 - sent to the verifier as data
        return wire.encode(_error(exc))
    return wire.encode({"ranks": [r if isinstance(r, bytes) else b"" for r in ranks]})


def handle(request: str) -> None:
    """Serve one request of the verifier (base64 of cloudpickle bytes it made); print the
    reply after MARK."""
    kind, body = cloudpickle.loads(base64.b64decode(request))
    if kind == "source":  # another submission's code: its own stand-in
        _STATE["source"] = body
        if (proc := _STATE.pop("proc", None)) is not None:
            proc[0].kill()
            proc[0].join(5)
        reply = wire.encode({"ok": True})
    elif kind == "run":
        reply = _run(*body)
    else:
        name, args, kwargs, refusing = body
        reply = _ask(kind, name, args, kwargs, refusing, CALL_TIMEOUT_S)
    print(MARK + base64.b64encode(reply).decode(), flush=True)
