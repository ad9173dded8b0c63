"""The verifier's handles on learner code: a sandboxed host, and the runs it stands in for.

- `Host`: a fresh kernel in a sandbox of its own (the grader's kernel manager: warm, limited),
  that never ran the learner's cells; `request` sends it one request of
  parlab.sandboxed.host and decodes the reply as plain data (`wire`), nothing else.
- `Session`: what the verifier puts in place of `parlab.launch.run` and of calling a learner's
  name while the tests run (`bound`):
  - a run whose arguments hold an `Answer` goes to the host: the learner's code runs on its
    ranks, and what they return is data. A run without one needs no learner code and runs
    here, on trusted ranks.
  - where the ranks' results hold a reference's values (keys in
    `parlab.check._harness.TRUSTED_KEYS`, e.g. "ref"), these are replaced by the same run's,
    made on trusted ranks with the instructor's solution (cached per run).
  - calling an `Answer` calls the learner's function in its stand-in process; a failure comes
    back as the exception the check would have seen in the notebook (`rebuild`).
"""

from __future__ import annotations

import atexit
import base64
import builtins
import contextlib
import hashlib
import io
import os
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import cloudpickle
from jupyter_core.utils import run_sync

from parlab import launch
from parlab.check import _harness
from parlab.errors import REFUSING, CheckFailed, NotWritten, stub_raised, unwritten_message
from parlab.grading.base.procs import KERNEL_ENV, kill_kernel_tree
from parlab.launch.errors import CollectiveMismatch, CollectiveTimeout, RankError
from parlab.sandboxed import inplace, wire
from parlab.sandboxed.host import MARK, learner_rank, named

__all__ = ["Host", "Session", "rebuild"]


class Host:
    """A sandboxed kernel that serves the verifier's requests (see the module doc)."""

    def __init__(self, manager_class: type, cwd: str, source: str) -> None:
        mark = uuid.uuid4().hex
        self._token = f"{KERNEL_ENV}={mark}"
        self.km = manager_class()
        run_sync(self.km.start_kernel)(cwd=cwd, env=dict(os.environ, **{KERNEL_ENV: mark}))
        self.kc = self.km.client()
        self.kc.start_channels()
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        self._sid: int | None = None
        with contextlib.suppress(OSError, TypeError):
            self._sid = os.getsid(pid) if pid and os.getsid(pid) == pid else None
        run_sync(self.kc.wait_for_ready)(timeout=120)
        self.request("source", source, timeout=30)

    def request(self, kind: str, body: Any, *, timeout: float) -> Any:
        """Send one request; its reply as plain data (WireError or TimeoutError if none)."""
        code = ("from parlab.sandboxed.host import handle as _verify\n"
                f"_verify({base64.b64encode(cloudpickle.dumps((kind, body))).decode()!r})")
        msg_id = self.kc.execute(code, silent=False, store_history=False)
        deadline = time.monotonic() + timeout
        text: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the sandbox did not answer within {timeout:.0f} s")
            try:
                msg = run_sync(self.kc.get_iopub_msg)(timeout=min(left, 5.0))
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind_ = msg["msg_type"]
            if kind_ == "stream" and msg["content"].get("name") == "stdout":
                text.append(msg["content"].get("text", ""))
            elif kind_ == "error":
                raise wire.WireError(f"the sandbox failed: {msg['content'].get('ename')}: "
                                     f"{msg['content'].get('evalue')}")
            elif kind_ == "status" and msg["content"].get("execution_state") == "idle":
                break
        line = next((ln for ln in "".join(text).splitlines() if ln.startswith(MARK)), None)
        if line is None:
            raise wire.WireError("the sandbox sent no reply")
        return wire.decode(base64.b64decode(line[len(MARK):]))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        with contextlib.suppress(Exception):
            run_sync(self.km.shutdown_kernel)(now=True)
        kill_kernel_tree(self._sid, self._token)  # the ranks and the stand-in too
        if (close := getattr(self.km, "close_sandbox", None)) is not None:
            close()


def rebuild(reply: dict) -> BaseException:
    """The exception a failure sent as data stands for, as the check would have seen it."""
    name, message = str(reply.get("error")), str(reply.get("message", ""))
    tb = str(reply.get("traceback", ""))
    if name == "CollectiveTimeout":
        return CollectiveTimeout(message, states={}, certain=bool(reply.get("certain")),
                                 elapsed=float(reply.get("elapsed") or 0.0))
    if name in ("RankError", "CollectiveMismatch"):
        cls = CollectiveMismatch if name == "CollectiveMismatch" else RankError
        reports = [tuple(r) for r in reply.get("reports", []) if isinstance(r, (list, tuple))]
        return cls(message, rank=int(reply.get("rank") or 0),
                   exc_type=str(reply.get("exc_type", "")), traceback=tb,
                   reports=reports, head=str(reply.get("head", "")) or message)
    if name == "CheckFailed":
        return CheckFailed(message, learner_traceback=tb)
    if name in ("NotImplementedError", "NotWritten") and stub_raised(tb):  # the stub: unwritten
        stub = NotWritten(message if name == "NotWritten" else unwritten_message(message))
        stub.learner_traceback = tb
        return stub
    if name == "WireError":
        return CheckFailed(f"what your code returned cannot be read as data: {message}",
                           learner_traceback=tb)
    known = getattr(builtins, name, None)
    if isinstance(known, type) and issubclass(known, Exception):
        return known(message)
    return type(name if name.isidentifier() else "LearnerError", (Exception,), {})(message)


class _AnswerFinder(cloudpickle.Pickler):
    """Pickles to nowhere, noting whether an Answer is anywhere in what it pickles (in a
    closure, a partial, an object's attributes)."""

    found = False

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, wire.Answer):
            self.found = True
        return None


def _has_answer(obj: Any) -> bool:
    finder = _AnswerFinder(io.BytesIO())
    finder.dump(obj)
    return finder.found


def _has_trusted(obj: Any) -> bool:
    if isinstance(obj, dict):
        return any(k in _harness.TRUSTED_KEYS or _has_trusted(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(_has_trusted(v) for v in obj)
    return False


def _merge(learner: Any, trusted: Any) -> Any:
    """learner's results with every TRUSTED_KEYS entry taken from `trusted`'s."""
    if isinstance(trusted, dict) and isinstance(learner, dict):
        out = dict(learner)
        for k, v in trusted.items():
            if k in _harness.TRUSTED_KEYS:
                out[k] = v
            elif k in learner:
                out[k] = _merge(learner[k], v)
        return out
    if type(trusted) in (list, tuple) and type(learner) in (list, tuple):
        merged = [_merge(a, b) for a, b in zip(learner, trusted, strict=False)]
        merged += list(learner[len(trusted):])
        return merged if isinstance(learner, list) else tuple(merged)
    return learner


def _seen(name: str, reply: Any) -> Any:
    if not isinstance(reply, dict) or "error" in reply:
        return wire.Answer(name)
    if isinstance(about := reply.get("callable"), dict):
        return wire.Answer(name, module=str(about.get("module") or "__main__"),
                           qualname=str(about.get("qualname") or ""),
                           bases=tuple(tuple(b) for b in about.get("bases") or ()))
    return reply.get("value")


class Session:
    """The verifier's stand-ins for `launch.run` and the learner's names (see module doc)."""

    def __init__(self, host: Host, solution: str, cache: dict, budget_s: float = 300.0) -> None:
        self.host, self.solution, self.cache = host, solution, cache
        self.deadline = time.monotonic() + budget_s

    def _request(self, kind: str, body: Any, timeout: float) -> Any:
        """host.request within what is left of this notebook's time."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CheckFailed("the grader's time for verifying this notebook ran out (your "
                              "code kept its processes busy past it)")
        return self.host.request(kind, body, timeout=min(timeout, left))

    def run(self, fn: Any, world_size: int = 2, *args: Any, backend: str | None = None,
            timeout: float = 60.0, trace: Any = None, **kwargs: Any) -> list:
        options: dict[str, Any] = {"backend": backend, "timeout": timeout}
        if not _has_answer((args, kwargs)):
            return _true_run(fn, world_size, *args, **options, **kwargs)
        reply = self._request("run", (fn, world_size, args, kwargs, options), timeout + 60)
        if "error" in reply:
            raise rebuild(reply)
        results = [wire.decode(r) for r in reply.get("ranks", [])]
        if len(results) != world_size:
            raise CheckFailed(f"{len(results)} results came back from {world_size} ranks")
        if _has_trusted(results):
            results = [_merge(mine, ref) for mine, ref in
                       zip(results, self._trusted(fn, world_size, args, kwargs, options),
                           strict=True)]
        return results

    def _trusted(self, fn: Any, world_size: int, args: tuple, kwargs: dict,
                 options: dict) -> list:
        """The same run on trusted ranks with the instructor's solution (cached)."""
        key = hashlib.sha256(cloudpickle.dumps((self.solution, fn, world_size, args, kwargs,
                                                options))).hexdigest()
        if key not in self.cache:
            out = _true_run(learner_rank, world_size, self.solution, "trusted", fn, args, kwargs,
                            **options)
            self.cache[key] = [wire.decode(r) for r in out]
        return self.cache[key]

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        """The learner's `name` called in its stand-in, under the refusals in force here; the
        arguments it changed in place there are changed the same way here."""
        refusing = [([n for n in map(named, refs) if n is not None], message)
                    for refs, message in REFUSING]  # found by name in the learner's process
        reply = self._request("call", (name, args, kwargs, refusing), 60)
        if "error" in reply:
            raise rebuild(reply)
        inplace.apply(reply.get("changed") or {}, args, kwargs)
        return reply.get("value")

    def values(self, names: list[str]) -> dict[str, Any]:
        """What a test sees under each of the learner's `names` (one request): an Answer
        (described as the learner's object describes itself), or its plain value."""
        reply = self._request("values", (list(names), (), {}, []), 60)
        found = reply.get("values") if isinstance(reply.get("values"), dict) else {}
        return {name: _seen(name, found.get(name)) for name in names}

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """parlab.launch.run and every Answer call go through this session meanwhile."""
        saved = launch.run, wire.Answer.caller
        launch.run, wire.Answer.caller = self.run, self.call
        try:
            yield
        finally:
            launch.run, wire.Answer.caller = saved


def _true_run(fn: Any, world_size: int, *args: Any, **kwargs: Any) -> list:
    """launch.run on trusted ranks of this process; the forkserver it starts is stopped when
    this process exits, so that nothing of the grader's outlives its worker."""
    if not _STOP_AT_EXIT:
        _STOP_AT_EXIT.append(atexit.register(_stop_forkserver))
    return _LAUNCH_RUN(fn, world_size, *args, **kwargs)


def _stop_forkserver() -> None:
    from multiprocessing import forkserver, resource_tracker

    helpers: list[Any] = [forkserver._forkserver, resource_tracker._resource_tracker]
    for helper in helpers:
        with contextlib.suppress(Exception):
            helper._stop()


_LAUNCH_RUN = launch.run
_STOP_AT_EXIT: list = []
