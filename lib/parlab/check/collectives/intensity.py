r"""Module 00, exercise 2: FLOPs per byte of TP and DP against a link, and the verdict.

`check_intensities(tp_intensity, dp_intensity, link_requirement)` and `check_placement`
compare the learner's numbers with `parlab.costs` (relative tolerance 1e-6, so float32 is
fine): tensor parallelism offers $\approx H$, data parallelism $3N_{tok}$ (the all-reduce
counted as 2P gradient elements), a link needs FLOP/s / (bytes/s), headroom is offered /
needed and a strategy is compute-bound when its headroom is at least 1. The points: the
worked example's numbers (H = 8192, 4M tokens, 989.4 TFLOP/s) on its three links, then random
points with hidden sizes that are not powers of two.

A right answer does not depend on, and the tests vary: every argument (the visible tests of both
checks add 20 random points, the hidden ones 200: H, tokens, FLOP/s and bytes/s drawn
log-uniformly), so a number of the worked example written in (its H, its 989.4 TFLOP/s, one of
its links) fails visibly and is named when the answer matches it.

While the learner's functions run, parlab.costs' FLOPs-per-byte functions are refused
(`call_learner(refuse=...)`): a wrapper around them gets the same message as a bare re-export.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable
from typing import Any

from parlab import costs
from parlab.check._compare import fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.errors import reference_message

__all__ = ["check_intensities", "check_placement", "REFUSED", "WORKED_POINT", "LINKS"]

WORKED_POINT = {"h": 8192, "n_tokens": 4e6, "flops_per_s": costs.H100_BF16_FLOPS}
LINKS = (costs.NVLINK_BIDIR_BYTES_PER_S, costs.NVLINK_PER_DIRECTION_BYTES_PER_S,
         costs.NIC_400G_BYTES_PER_S)
REFUSED = (costs.tp_flops_per_byte, costs.tp_layer_flops_per_byte, costs.dp_flops_per_byte,
           costs.required_flops_per_byte, costs.headroom, costs.comm_verdict)
WHAT = ("parlab.costs' FLOPs-per-byte functions (tp_flops_per_byte, dp_flops_per_byte, "
        "required_flops_per_byte, headroom, comm_verdict)")
_DP_HINTS = {
    1 / 3: "you counted the forward pass only (2P FLOPs per token: 2PN/2P = N). A training "
           "step is forward plus backward, 6P FLOPs per token (the backward costs twice the "
           "forward): 6PN / 2P = 3N",
    0.5: "yours is 1.5 N_tok. Two mistakes give exactly this: counting the all-reduce in bf16 "
         "bytes (4P: 2 bytes per gradient element; this exercise counts 2P gradient elements, "
         "as the worked example does), or counting 3P FLOPs per token instead of 6P (2 "
         "forward + 4 backward). The expected form is 6PN / 2P = 3N",
    2 / 3: "yours is 2 N_tok: you counted the backward pass only (4P FLOPs per token); add "
           "the forward's 2P: 6PN / 2P = 3N",
    1 / 6: "you counted the forward only (2P per token) and the all-reduce in bf16 bytes (4P): "
           "the expected form is 6PN / 2P = 3N",
    2.0: "you counted the all-reduce as P: a ring all-reduce sends about twice the gradient, "
         "2P (reduce-scatter, then all-gather): 6PN / 2P = 3N",
}


def _tp_hints(h: float) -> dict[float, str]:
    dropped = ("the ratio is H with every constant dropped (the 2 all-reduces per layer, the "
               "2 bytes per bf16 element and the GEMMs' factors are all constants): return H")
    hints = {float(h): "that is the FLOPs alone (~H^2 per token): divide by the bytes moved, "
                       "BSH^2 / BSH = H",
             1 / h**2: "inverted: FLOPs per byte is FLOPs / bytes, BSH^2 / BSH = H",
             **dict.fromkeys((2.0, 0.5, 0.25, 4.0), dropped)}
    for t in range(2, 9):
        for e in (1, 2, 4):
            hints.setdefault(9 / ((t - 1) * e), "that looks like the ratio with its constants "
                             "kept, 9H/((t-1)e); this exercise asks for the order of magnitude, "
                             "H")
    return hints


def _link_hints(req: float) -> dict[float, str]:
    return {1 / req**2: "inverted: a link needs FLOP/s / (bytes/s) FLOPs per byte",
            **dict.fromkeys((1e9, 1e-9), "off by 1e9: the arguments are in FLOP/s and bytes/s"),
            **dict.fromkeys((8.0, 1 / 8), "bits against bytes: bytes_per_s is already in "
                            "bytes per second, use it as given"),
            **dict.fromkeys((2.0, 0.5), "use bytes_per_s as given, whichever link it is")}


def _points(random_points: int, seed: int) -> list[dict]:
    """The worked example on each of its links, then random points (log-uniform), with hidden
    sizes that are not powers of two."""
    rng = random.Random(seed)
    return [dict(WORKED_POINT, bytes_per_s=b) for b in LINKS] + [
        {"h": rng.randrange(513, 131072, 2), "n_tokens": round(10 ** rng.uniform(3, 8)),
         "flops_per_s": 10 ** rng.uniform(12, 16), "bytes_per_s": 10 ** rng.uniform(9, 12)}
        for _ in range(random_points)]


def _not_the_course(fn: Any, name: str) -> None:
    """A bare re-export of a refused function gets the refusal's own message."""
    if getattr(fn, "__wrapped__", fn) in REFUSED:
        fail(reference_message(WHAT))
    not_reexport(fn, name=name)


def _call(stage: str, fn: Callable[..., Any], *args: Any) -> Any:
    return call_learner(stage, fn, *args, refuse=REFUSED, refusal=WHAT)


def _number(got: Any, want: float, call: str, hints: dict[float, str],
            worked: float | None = None) -> None:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"{call} returned {type(got).__name__} ({got!r:.40}), expected a number "
             f"({want:.6g})", hint="return a plain float (a tensor or a string is not a number "
             "here: float(x) converts)")
    got = float(got)
    if math.isclose(got, want, rel_tol=1e-6):
        return
    ratio = got / want if want else float("nan")
    hint = next((h for r, h in hints.items() if math.isclose(ratio, r, rel_tol=1e-6)), None)
    if worked is not None and math.isclose(got, worked, rel_tol=1e-6):
        hint = ("that is the worked example's value, whatever the arguments: compute the result "
                "from the arguments (the hidden tests use other sizes, devices and links)")
    fail(f"{call} = {got:.9g}, expected {want:.9g} (ratio got/expected = {ratio:.4g})",
         hint=hint or "compare your formula with the text's derivation, term by term; the "
         "check compared at the worked example's numbers first, then at random points")


@exercise("interconnect_intensities")
def check_intensities(tp_intensity: Callable, dp_intensity: Callable,
                      link_requirement: Callable, *, random_points: int = 0,
                      seed: int = 0, quiet: bool = False) -> None:
    """tp_intensity(h) ~ H, dp_intensity(n_tokens) = 3 N_tok, link_requirement = FLOP/s / B/s."""
    for fn, name in ((tp_intensity, "tp_intensity"), (dp_intensity, "dp_intensity"),
                     (link_requirement, "link_requirement")):
        _not_the_course(fn, name)
    worked_tp = costs.tp_flops_per_byte(WORKED_POINT["h"])
    worked_dp = costs.dp_flops_per_byte(WORKED_POINT["n_tokens"])
    worked_links = [costs.required_flops_per_byte(WORKED_POINT["flops_per_s"], b) for b in LINKS]
    for p in _points(random_points, seed):
        h, n, f, b = p["h"], p["n_tokens"], p["flops_per_s"], p["bytes_per_s"]
        _number(_call(f"tp_intensity({h})", tp_intensity, h), costs.tp_flops_per_byte(h),
                f"tp_intensity({h})", _tp_hints(h), worked_tp)
        _number(_call(f"dp_intensity({n:g})", dp_intensity, n), costs.dp_flops_per_byte(n),
                f"dp_intensity({n:g})", _DP_HINTS, worked_dp)
        req = costs.required_flops_per_byte(f, b)
        call = f"link_requirement({f:.4g}, {b:.4g})"
        got = _call(call, link_requirement, f, b)
        fixed = next((w for w in worked_links if isinstance(got, numbers.Real)
                      and math.isclose(float(got), w, rel_tol=1e-6)), None) \
            if p["flops_per_s"] != WORKED_POINT["flops_per_s"] else None  # a random point
        _number(got, req, call, _link_hints(req), fixed)
    if not quiet:
        print(f"intensities OK at {len(_points(random_points, seed))} points")


def _worked_in_placement(p: dict, key: str) -> dict[float, str]:
    """Ratios got/expected of a headroom computed with one of the worked example's numbers in
    place of the argument (at a random point, where they differ), each with its hint."""
    said = "the worked example's {} written in instead of the argument {}: compute from the " \
           "arguments (the test also uses other devices, links and sizes)"
    out = {p["flops_per_s"] / WORKED_POINT["flops_per_s"]:
           said.format(f"{WORKED_POINT['flops_per_s'] / 1e12:g} TFLOP/s", "flops_per_s")}
    for link in LINKS:
        out.setdefault(link / p["bytes_per_s"],
                       said.format(f"link of {link / 1e9:g} GB/s", "bytes_per_s"))
    offered = costs.tp_flops_per_byte if key == "tp" else costs.dp_flops_per_byte
    arg = "h" if key == "tp" else "n_tokens"
    out.setdefault(offered(WORKED_POINT[arg]) / offered(p[arg]),
                   said.format(f"{arg} = {WORKED_POINT[arg]:g}", arg))
    return {r: h for r, h in out.items() if abs(r - 1) > 1e-6}  # at a worked point: no story


def _shape_ok(out: Any) -> bool:
    return isinstance(out, dict) and set(out) == {"tp", "dp"} and all(
        isinstance(v, dict) and {"compute_bound", "headroom"} <= set(v) for v in out.values())


@exercise("interconnect_placement", needs={
    "interconnect_intensities": "tp_intensity, dp_intensity and link_requirement (the first "
                                "test of exercise 2)"})
def check_placement(placement: Callable, *, random_points: int = 0, seed: int = 0,
                    quiet: bool = False) -> None:
    """placement(h, n_tokens, flops_per_s, bytes_per_s) -> {"tp"|"dp": {"compute_bound",
    "headroom"}} with headroom = intensity / requirement, compute-bound when >= 1."""
    _not_the_course(placement, "placement")
    for p in _points(random_points, seed):
        call = ("placement(h={h}, n_tokens={n_tokens:g}, flops_per_s={flops_per_s:.4g}, "
                "bytes_per_s={bytes_per_s:.4g})").format(**p)
        out = _call(call, placement, p["h"], p["n_tokens"], p["flops_per_s"], p["bytes_per_s"])
        if not _shape_ok(out):
            fail(f"{call} returned {out!r:.200}", hint='return a dict shaped like {"tp": '
                 '{"compute_bound": bool, "headroom": float}, "dp": {...the same...}}')
        for key, offered in (("tp", costs.tp_flops_per_byte(p["h"])),
                             ("dp", costs.dp_flops_per_byte(p["n_tokens"]))):
            want = costs.headroom(offered, p["flops_per_s"], p["bytes_per_s"])
            hints = {1 / want**2: "inverted: headroom = what the strategy offers / what the "
                                  "link needs (intensity / link requirement); above 1 is "
                                  "compute-bound"}
            hints.update(_worked_in_placement(p, key))
            hints.update(_DP_HINTS if key == "dp" else _tp_hints(p["h"]))
            _number(out[key]["headroom"], want, f'{call}["{key}"]["headroom"]', hints)
            bound = out[key]["compute_bound"]
            if type(bound).__name__ not in ("bool", "bool_") or bool(bound) != (want >= 1):
                fail(f'{call}["{key}"]["compute_bound"] = {bound!r} ({type(bound).__name__}), '
                     f"expected {want >= 1} (headroom {want:.3g})", hint="a bool, True when "
                     "headroom >= 1: the strategy does at least the FLOPs per byte the link needs")
    if not quiet:
        print(f"placement OK at {len(_points(random_points, seed))} points")
