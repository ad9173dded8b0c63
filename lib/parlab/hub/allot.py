"""The GPU allotment of a shared box: each learner's server gets a disjoint set of GPUs.

    plan = Plan(gpus=range(8), per_learner=2)               # the instructor's plan
    pool = Allotment("autograder/hub/run/gpus.json", plan)
    pool.take("alice")        # [0, 1]  -> the server starts with PARLAB_GPUS=0,1
    pool.take("eve")          # []      -> all held: CPU ranks over gloo (when_full="cpu")
    pool.give_back("alice")   # [0, 1]  -> back in the pool (server stopped or culled idle)
    pool.holders()            # {"bob": [2, 3], ...}: who holds which GPUs

The state is one JSON file; every change holds an exclusive `fcntl` lock on a file beside it
and rewrites it atomically (a temporary file renamed over it), so that two spawns at once
never get the same GPU and a hub restart finds who holds what. A learner who asks again gets
the GPUs they already hold (a restarted hub re-spawning a running server changes nothing).
`reconcile(running)` returns to the pool what servers no longer running hold (a server that
died while the hub was down): the hub's `gpu-pool` service calls it with the hub's list.
Nothing here imports JupyterHub: the hub's hooks (`parlab.hub.hooks`) call it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["Plan", "Allotment", "AllotmentFull", "WhenFull"]

WhenFull = Literal["cpu", "wait"]


class AllotmentFull(RuntimeError):
    """Every GPU is held and the plan says to wait (when_full="wait"), for longer than allowed."""


@dataclass(frozen=True, init=False)
class Plan:
    """The instructor's plan: which GPUs the class shares, how many each server gets, and what
    a server gets when they are all held ("cpu": CPU ranks over gloo; "wait": wait for some)."""

    gpus: tuple[int, ...] = field(default_factory=tuple)
    per_learner: int = 1
    when_full: WhenFull = "cpu"

    def __init__(self, gpus: Iterable[int] = (), per_learner: int = 1, *,
                 when_full: WhenFull = "cpu") -> None:
        chosen = tuple(int(g) for g in gpus)
        if len(set(chosen)) != len(chosen) or any(g < 0 for g in chosen):
            raise ValueError(f"the plan's GPUs {list(chosen)} must be distinct numbers >= 0")
        if per_learner < 1:
            raise ValueError(f"per_learner={per_learner}: each server gets at least one GPU")
        if when_full not in ("cpu", "wait"):
            raise ValueError(f"when_full={when_full!r}: 'cpu' (CPU ranks) or 'wait'")
        object.__setattr__(self, "gpus", chosen)
        object.__setattr__(self, "per_learner", per_learner)
        object.__setattr__(self, "when_full", when_full)

    @property
    def seats(self) -> int:
        """How many servers can hold GPUs at once."""
        return len(self.gpus) // self.per_learner


class Allotment:
    """A pool of GPUs shared by a class, its state in the JSON file `path` (see module doc)."""

    def __init__(self, path: str | os.PathLike[str], plan: Plan) -> None:
        self.path = Path(path)
        self.plan = plan

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Allotment:
        """The allotment the hub keeps in `path`, with the plan written in it (for commands
        that do not read the hub's configuration, such as `python -m parlab.hub gpus`)."""
        try:
            plan = json.loads(Path(path).read_text()).get("plan", {})
        except FileNotFoundError:
            plan = {}
        return cls(path, Plan(plan.get("gpus", ()), plan.get("per_learner", 1),
                              when_full=plan.get("when_full", "cpu")))

    # -- the state file, read and written only under the lock ---------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, list[int]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                held = self._read()
                before = json.dumps(held, sort_keys=True)
                yield held
                if json.dumps(held, sort_keys=True) != before:
                    self._write(held)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, list[int]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as err:
            raise RuntimeError(f"{self.path} is not the allotment's JSON ({err}); remove it "
                               "to start with every GPU free") from None
        return {str(k): [int(g) for g in v] for k, v in data.get("held", {}).items()}

    def _write(self, held: dict[str, list[int]]) -> None:
        data = {"plan": {"gpus": list(self.plan.gpus), "per_learner": self.plan.per_learner,
                         "when_full": self.plan.when_full}, "held": held}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)

    # -- what the hub calls --------------------------------------------------------------
    def take(self, learner: str, *, wait_s: float = 0.0, poll_s: float = 1.0) -> list[int]:
        """The GPUs `learner`'s server may use ([] : CPU ranks over gloo). The ones they hold
        already, else `per_learner` free ones (lowest first). When none are free: [] under
        when_full="cpu"; under "wait", wait up to `wait_s` seconds, then AllotmentFull."""
        deadline = time.monotonic() + wait_s
        while True:
            got = self._try_take(learner)
            if got is not None:
                return got
            if self.plan.when_full == "cpu":
                return []
            if time.monotonic() >= deadline:
                raise AllotmentFull(
                    f"all {len(self.plan.gpus)} GPUs are held ({self.plan.seats} servers with "
                    f"{self.plan.per_learner} each); try again when a server stops")
            time.sleep(poll_s)

    def _try_take(self, learner: str) -> list[int] | None:
        with self._locked() as held:
            if learner in held:
                return list(held[learner])
            taken = {g for gs in held.values() for g in gs}
            free = [g for g in self.plan.gpus if g not in taken]
            if len(free) < self.plan.per_learner:
                return None
            held[learner] = free[: self.plan.per_learner]
            return list(held[learner])

    def give_back(self, learner: str) -> list[int]:
        """Return `learner`'s GPUs to the pool; the ones returned ([] if they held none)."""
        with self._locked() as held:
            return held.pop(learner, [])

    def holders(self) -> dict[str, list[int]]:
        """Who holds which GPUs now."""
        with self._locked() as held:
            return {k: list(v) for k, v in sorted(held.items())}

    def reconcile(self, running: Iterable[str]) -> dict[str, list[int]]:
        """Return the GPUs of every learner not in `running` (servers the hub no longer runs,
        pending ones included); what was returned, by learner."""
        alive = set(running)
        with self._locked() as held:
            gone = {k: held.pop(k) for k in sorted(held) if k not in alive}
        return gone

    def table(self) -> str:
        """Who holds which GPUs, and which are free, as lines for a terminal."""
        held = self.holders()
        taken = {g: who for who, gs in held.items() for g in gs}
        rows = [f"GPU {g}: {taken.get(g, 'free')}" for g in self.plan.gpus]
        seats = self.plan.seats - len(held)
        rows.append(f"{len(held)} server{' holds' if len(held) == 1 else 's hold'} GPUs "
                    f"({self.plan.per_learner} each); "
                    f"{max(seats, 0)} more can get some, then "
                    + ("CPU ranks over gloo" if self.plan.when_full == "cpu" else "they wait"))
        return "\n".join(rows)
