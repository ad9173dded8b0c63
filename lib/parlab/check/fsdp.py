r"""Graded checks of module 01, "Memory and sharding".

Exercise 1, `check_state_bytes(state_bytes, practice)`: per-device bytes of weights (2 B),
gradients (2 B) and Adam state (12 B) per parameter, against closed forms written here:
ddp $16P$, zero1 $4P + 12P/d$, zero2 $2P + 14P/d$, zero3 = fsdp $16P/d$; then seed 003's
practice problem, 70B on 32 H100s of 80 GB.
Exercise 2, `check_fsdp_layer(FSDPLinear)`: in `parlab.check.fsdp_layer`.
Exercise 3, `check_reshard_plan(plan)`: reshard_after_forward per layer, graded by the peak
memory of the kept layers (at most the budget) and the bytes moved (the fewest possible, found
here by trying every subset): kept, layer i moves $2\frac{t-1}{t}s_i$; resharded,
$3\frac{t-1}{t}s_i$.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from parlab.check import CheckFailed, fail, not_reexport
from parlab.check.fsdp_layer import check_fsdp_layer

__all__ = ["check_state_bytes", "check_fsdp_layer", "check_reshard_plan", "CheckFailed"]

PARTS = {"weights": 2, "grads": 2, "optimizer": 12}
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
           "zero3": ("optimizer", "grads", "weights"), "fsdp": ("optimizer", "grads", "weights")}
FORMULA = {"ddp": "16P", "zero1": "4P + 12P/d", "zero2": "2P + 14P/d", "zero3": "16P/d",
           "fsdp": "16P/d"}


def _expected_state(p: float, strategy: str, d: int) -> float:
    return {"ddp": 16 * p, "zero1": 4 * p + 12 * p / d, "zero2": 2 * p + 14 * p / d,
            "zero3": 16 * p / d, "fsdp": 16 * p / d}[strategy]


def _state_story(got: float, p: float, strategy: str, d: int) -> str:
    if math.isclose(got, 16 * p):
        return "every part kept whole: " + FORMULA[strategy] + " divides the sharded parts by d"
    for name, parts in SHARDED.items():
        guess = sum(v * p / (d if k in parts else 1) for k, v in PARTS.items())
        if parts != SHARDED[strategy] and math.isclose(got, guess):
            return (f"that is {name}'s memory: {strategy} shards "
                    f"{', '.join(SHARDED[strategy]) or 'nothing'} (ZeRO-1 the optimizer state, "
                    "ZeRO-2 also the gradients, ZeRO-3 and FSDP also the weights)")
    if math.isclose(got, 12 * p / d if strategy != "ddp" else 12 * p):
        return "only the optimizer state counted: add the weights (2 B) and gradients (2 B)"
    return f"per device, with W = 2, G = 2, O = 12 bytes per parameter: {FORMULA[strategy]}"


def check_state_bytes(state_bytes: Callable[..., Any], practice: dict[str, Any], *,
                      quiet: bool = False) -> None:
    """state_bytes(n_params, strategy, dp) for every strategy over a grid; then `practice`:
    {"ddp_per_gpu": bytes, "zero3_per_gpu": bytes, "ddp_fits": bool, "zero3_fits": bool}."""
    not_reexport(state_bytes, name="state_bytes")
    for p, d, strategy in itertools.product((1e6, 7e9, 70e9), (1, 2, 8, 32), SHARDED):
        try:
            got = state_bytes(p, strategy, d)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            fail(f"state_bytes({p:g}, {strategy!r}, {d}) raised {type(exc).__name__}: {exc}",
                 hint="strategy is one of 'ddp', 'zero1', 'zero2', 'zero3', 'fsdp'")
        want = _expected_state(p, strategy, d)
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9):
            fail(f"state_bytes({p:g}, {strategy!r}, dp={d}): expected {want:,.0f} B per "
                 f"device, got {got!r}", hint=_state_story(got, p, strategy, d)
                 if isinstance(got, (int, float)) else "return a number of bytes")
    want = {"ddp_per_gpu": 16 * 70e9, "zero3_per_gpu": 16 * 70e9 / 32, "ddp_fits": False,
            "zero3_fits": True}
    for key, value in want.items():
        got = practice.get(key) if isinstance(practice, dict) else None
        ok = (got is value) if isinstance(value, bool) else (
            isinstance(got, (int, float)) and math.isclose(got, value, rel_tol=1e-9))
        if not ok:
            fail(f"practice[{key!r}] (70B parameters, 32 GPUs of 80 GB): expected {value!r}, "
                 f"got {got!r}", hint="use your state_bytes with n_params=70e9 and dp=32; a "
                 "plan fits when its bytes per GPU are at most 80e9")
    if not quiet:
        print("state_bytes agrees with the closed forms for 5 strategies x 12 sizes; "
              "practice problem: DDP needs 1.12e12 B per GPU, ZeRO-3 3.5e10 B. Passed.")


# --- exercise 3: the reshard plan -----------------------------------------------------------

CASES = [  # (sizes in MB, budget in MB, t); three of them defeat "keep the largest first"
    ([4, 4, 4, 4], 100, 4), ([4, 4, 4, 4], 0, 2), ([10, 2, 7, 3], 12, 8),
    ([6, 5, 5], 10, 4), ([8, 3, 3, 3, 3], 12, 2), ([9, 7, 6, 4, 2], 12, 8),
]


def _cost(sizes: list[float], reshard: list[bool], t: int) -> tuple[float, float]:
    peak = sum(s for s, r in zip(sizes, reshard, strict=True) if not r)
    moved = sum((3 if r else 2) * (t - 1) / t * s for s, r in zip(sizes, reshard, strict=True))
    return peak, moved


def _best_moved(sizes: list[float], budget: float, t: int) -> float:
    best = math.inf
    for plan in itertools.product((True, False), repeat=len(sizes)):
        peak, moved = _cost(sizes, list(plan), t)
        if peak <= budget:
            best = min(best, moved)
    return best


def check_reshard_plan(plan: Callable[..., Any], *, quiet: bool = False) -> None:
    """plan(sizes, budget) -> [reshard_after_forward per layer] over CASES (sizes in bytes)."""
    not_reexport(plan, name="plan_reshard")
    for sizes_mb, budget_mb, t in CASES:
        sizes, budget = [s * 1e6 for s in sizes_mb], budget_mb * 1e6
        label = f"plan_reshard(sizes={sizes_mb} MB, budget={budget_mb} MB)"
        try:
            got = plan(list(sizes), budget)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            fail(f"{label} raised {type(exc).__name__}: {exc}")
        if not isinstance(got, (list, tuple)) or len(got) != len(sizes) \
                or not all(isinstance(x, bool) for x in got):
            fail(f"{label} returned {got!r}; expected a list of {len(sizes)} bools, True for "
                 "a layer resharded after forward (freed), False for one kept resident")
        peak, moved = _cost(sizes, list(got), t)
        best = _best_moved(sizes, budget, t)
        if peak > budget:
            fail(f"{label} keeps {peak / 1e6:g} MB resident, over the {budget_mb} MB budget",
                 hint="a kept layer (reshard False) holds its whole gathered weights from "
                      "forward to backward; the kept sizes must add up to at most the budget")
        if moved > best * (1 + 1e-9):
            fail(f"{label} with t = {t}: your plan moves {moved / 1e6:.4g} MB per rank, the best "
                 f"plan {best / 1e6:.4g} MB", hint="every kept layer saves one all-gather of its "
                 "size, so keep the set of layers with the LARGEST total size that fits the "
                 "budget; keeping the largest layers first can leave budget unused (try every "
                 "subset, there are few layers)")
    if not quiet:
        print(f"plan_reshard: {len(CASES)} cases within budget at the fewest bytes. Passed.")
