r"""Module 01, exercise 1: `check_state_bytes(state_bytes, practice)`.

Per-device bytes of weights (2 B), gradients (2 B) and Adam state (12 B) per parameter,
against closed forms written here, with d the data-parallel degree: ddp $16P$, zero1
$4P + 12P/d$, zero2 $2P + 14P/d$, zero3 = fsdp $16P/d$; over a grid of sizes and degrees
(3, 6 and 12 among them: no degree special-cased) and, hidden, random points. Then the
practice problem: 70B parameters on 32 H100s of 80 GB. parlab.costs' state and traffic
functions are refused while `state_bytes` runs.

A right answer does not depend on, and the tests vary: P (1e6, 7e9, 70e9; hidden random up to
1e12), the degree d (1, 2, 3, 8, 12, 32; hidden random up to 600), the strategy (all five).
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
from collections.abc import Callable
from typing import Any

from parlab.check._compare import expect_type, fail
from parlab.check._harness import exercise
from parlab.check.fsdp.common import COSTS_WHAT, call, cost_references, not_the_course

__all__ = ["check_state_bytes"]

PARTS = {"weights": 2, "grads": 2, "optimizer": 12}
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
           "zero3": ("optimizer", "grads", "weights"), "fsdp": ("optimizer", "grads", "weights")}
FORMULA = {"ddp": "16P", "zero1": "4P + 12P/d", "zero2": "2P + 14P/d", "zero3": "16P/d",
           "fsdp": "16P/d"}
PRACTICE = {"n_params": 70e9, "dp": 32, "gpu_bytes": 80e9}


def _expected(n_params: float, strategy: str, d: int) -> float:
    """Bytes per device: FORMULA, with P = n_params."""
    return {"ddp": 16 * n_params, "zero1": 4 * n_params + 12 * n_params / d,
            "zero2": 2 * n_params + 14 * n_params / d, "zero3": 16 * n_params / d,
            "fsdp": 16 * n_params / d}[strategy]


def _story(got: float, n_params: float, strategy: str, d: int) -> str:
    want = _expected(n_params, strategy, d)
    if math.isclose(got, want * 1e-9, rel_tol=1e-9):
        return "that is gigabytes: return bytes (1 GB = 1e9 B)"
    if d > 1 and math.isclose(got, 16 * n_params):
        return "every part kept whole: " + FORMULA[strategy] + " divides the sharded parts by d"
    for name, parts in SHARDED.items():
        guess = sum(v * n_params / (d if k in parts else 1) for k, v in PARTS.items())
        if parts != SHARDED[strategy] and math.isclose(got, guess):
            return (f"that is {name}'s memory: {strategy} shards "
                    f"{', '.join(SHARDED[strategy]) or 'nothing'} (ZeRO-1 the optimizer state, "
                    "ZeRO-2 also the gradients, ZeRO-3 and FSDP also the weights)")
    if math.isclose(got, 12 * n_params / (d if strategy != "ddp" else 1)):
        return "only the optimizer state counted: add the weights (2 B) and gradients (2 B)"
    if math.isclose(got, want * d) or math.isclose(got, want / d):
        return f"off by a factor d = {d}: only the sharded parts are divided by d, once"
    return f"per device, with W = 2, G = 2, O = 12 bytes per parameter: {FORMULA[strategy]}"


def _grid(random_points: int, seed: int) -> list[tuple[float, int, str]]:
    rng = random.Random(seed)
    grid = list(itertools.product((1e6, 7e9, 70e9), (1, 2, 3, 8, 12, 32), SHARDED))
    return grid + [(rng.uniform(1e6, 1e12), rng.randint(1, 600), rng.choice(list(SHARDED)))
                   for _ in range(random_points)]


def _check_practice(practice: Any) -> None:
    expect_type(practice, dict, name="practice", what="a dict with keys ddp_per_gpu, "
                "zero3_per_gpu, ddp_fits, zero3_fits")
    n_params, d, cap = PRACTICE["n_params"], PRACTICE["dp"], PRACTICE["gpu_bytes"]
    want = {"ddp_per_gpu": 16 * n_params, "zero3_per_gpu": 16 * n_params / d,
            "ddp_fits": 16 * n_params <= cap, "zero3_fits": 16 * n_params / d <= cap}
    for key, value in want.items():
        got = practice.get(key)
        if isinstance(value, bool):
            ok = type(got).__name__ in ("bool", "bool_") and bool(got) is value
        else:
            ok = isinstance(got, numbers.Real) and not isinstance(got, bool) and math.isclose(
                got, value, rel_tol=1e-9)
        if ok:
            continue
        hint = ("use your state_bytes with n_params=70e9 and dp=32; a plan fits when its bytes "
                "per GPU are at most 80e9 (80 GB, SI)")
        if isinstance(got, numbers.Real) and math.isclose(float(got), float(value) / 1e9):
            hint = "that is gigabytes: the practice numbers are bytes, like state_bytes"
        elif key not in practice:
            hint = f"practice has no key {key!r}: fill all four"
        elif isinstance(value, bool):
            hint = "a bool: True when the bytes per GPU are at most 80e9"
        fail(f"practice[{key!r}] (70B parameters, 32 GPUs of 80 GB): expected {value!r}, "
             f"got {got!r}", hint=hint)


@exercise("state_bytes")
def check_state_bytes(state_bytes: Callable[..., Any], practice: dict[str, Any], *,
                      random_points: int = 0, seed: int = 0, quiet: bool = False) -> None:
    """state_bytes(n_params, strategy, dp) for every strategy over a grid (and random points);
    then `practice`: {"ddp_per_gpu": bytes, "zero3_per_gpu": bytes, "ddp_fits": bool,
    "zero3_fits": bool}."""
    refs = cost_references()
    not_the_course(state_bytes, "state_bytes", refs, COSTS_WHAT)
    grid = _grid(random_points, seed)
    for n_params, d, strategy in grid:
        label = f"state_bytes({n_params:g}, {strategy!r}, dp={d})"
        got = call(label, state_bytes, n_params, strategy, d, refs=refs, what=COSTS_WHAT,
                   hint="strategy is one of 'ddp', 'zero1', 'zero2', 'zero3', 'fsdp'; dp is "
                   "the number of ranks sharing the state")
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(f"{label} returned {type(got).__name__} ({got!r:.40}), expected a number of "
                 "bytes", hint="return a plain int or float (float(x) converts a tensor)")
        want = _expected(n_params, strategy, d)
        if not math.isclose(got, want, rel_tol=1e-9):
            fail(f"{label}: expected {want:,.0f} B per device, got {got!r}",
                 hint=_story(float(got), n_params, strategy, d))
    _check_practice(practice)
    if not quiet:
        print(f"state_bytes agrees with the closed forms at {len(grid)} points (5 strategies); "
              "practice problem: DDP needs 1.12e12 B per GPU, ZeRO-3 3.5e10 B. Passed.")
