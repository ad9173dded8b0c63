r"""The hints of module 08's exercise 5 (`parlab.check.whole.clip`), each for an outcome the
check establishes from the norms the ranks returned: the ranks disagree (each its own norm;
along which grid axis), the norm is the single device's squared, a set of the grid's copies
counted as often as it is held, a sum of norms; otherwise only that it is too large or too
small, with the causes that could give it."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

__all__ = ["SQUARES", "SQUARED", "TOO_LARGE", "TOO_SMALL", "PER_RANK", "AXIS", "COPIES",
           "copy_sets", "counted_twice"]

SQUARES = ("add squares, not norms: each rank sums g**2 over the pieces it counts, one "
           "all-reduce adds those sums, and the norm is the square root of the total")
SQUARED = ("the squared norm: the all-reduced sum of squares is the norm squared, ||g||^2; "
           "return its square root, total.sqrt(), and clip with that")
TOO_LARGE = ("the norm is larger than the single device's by an amount that none of these "
             "gives: a set of the grid's copies counted twice, norms added instead of squares, "
             "the square root left out; each entry's square must be added exactly once, and "
             "the norm is the square root of the world's total")
TOO_SMALL = ("the norm is smaller than the single device's: either some pieces were not "
             "counted (a reduction missing, or a piece split over TP or EP counted on one rank "
             "only), or the sums were averaged over the ranks instead of added")
PER_RANK = ("each rank clipped with the norm of its own gradients (torch.nn.utils."
            "clip_grad_norm_ on its pieces): every rank must use the norm of the whole "
            "model, so sum the squares locally and all-reduce the sum before the sqrt")
AXIS = {
    "pp": "add the pipeline stages' sums: each stage holds other layers (all-reduce over "
          "the world, or over grid.pp after grid.tp)",
    "tp": "add the TP ranks' sums: the pieces of a TP-split tensor are on different ranks",
    "ep": "add the ep ranks' sums: each holds other experts",
    "dp": "every rank needs the total: a rank that counts nothing (a DP or CP replica other "
          "than the first) must still receive it (all-reduce over the world)",
}
COPIES = {
    "tp": "the tensors whole on every TP rank (spec.tp_dim is None: {names}) counted on each "
          "of the {n} TP ranks",
    "ep": "the dense tensors (spec.ep_dim is None) counted on each of the {n} ep ranks",
    "tied": "the tied embedding counted twice, on stage 0 and as the last stage's copy "
            "(spec.tied_copy)",
    "dp": "every piece counted on each of the {n} DP x CP replicas (count only where "
          "grid.coords['dp'] == grid.coords['cp'] == 0)",
}


def copy_sets(results: list[dict], plan: Any) -> dict[str, tuple[int, set[str]]]:
    """Axis -> (how many hold each copy, the names copied along it), for this grid."""
    names = {k: set() for k in ("tp", "ep", "tied", "dp")}  # type: dict[str, set[str]]
    for r in results:
        for name, whole_tp, dense, tied in r["copies"]:
            if whole_tp and plan.tp > 1:
                names["tp"].add(name)
            if dense and plan.ep > 1:
                names["ep"].add(name)
            if tied:
                names["tied"].add(name)
            if plan.dp * plan.cp > 1:
                names["dp"].add(name)
    sizes = {"tp": plan.tp, "ep": plan.ep, "tied": 2, "dp": plan.dp * plan.cp}
    return {a: (sizes[a], n) for a, n in names.items() if n}


def counted_twice(got: float, grads: dict[str, torch.Tensor], copies: dict, *,
                  rtol: float) -> str | None:
    """The set of copies that, each counted as often as it is held, gives the norm `got`
    (the closest, within `rtol`: an RMSNorm's squares are ~1e-5 of the total)."""
    squares = {n: float(g.double().pow(2).sum()) for n, g in grads.items()}
    axes = sorted(copies)
    best: tuple[float, tuple[str, ...] | None] = (rtol, None)
    for k in range(1, len(axes) + 1):
        for chosen in itertools.combinations(axes, k):
            total = sum(sq * math.prod(copies[a][0] for a in chosen if n in copies[a][1])
                        for n, sq in squares.items())
            error = abs(got - math.sqrt(total)) / got
            if error < best[0]:
                best = (error, chosen)
    if best[1] is None:
        return None
    return "; ".join(COPIES[a].format(n=copies[a][0], names=few(copies[a][1]))
                     for a in best[1])


def few(names: set[str]) -> str:
    shown = sorted(names, key=lambda n: (len(n), n))[:3]
    return ", ".join(shown) + (", ..." if len(names) > 3 else "")
