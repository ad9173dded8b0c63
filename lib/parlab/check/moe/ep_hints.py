"""The likely-mistake sentences of module 06's dispatch checks (exercises 3 and 4), and the
configurations a check runs so that a failure can say what the answer depends on.

A check asked for another number of experts per rank or another k than the visible tests'
first calls (2 and 2) runs that base configuration first, in the same launch: when the base
passes and the asked one fails, what differs between them is established, and named ("either
... or ..." when both differ); when the base fails too, its own failure is reported."""

from __future__ import annotations

__all__ = ["K", "BASE", "configs", "varied", "top_k_hint", "GATES", "RESIDUAL", "NO_DROPS",
           "STATIC", "PER_RANK", "SHAPES", "OTHER", "HANG"]

K = 2  # each token's experts in the visible tests' first calls
BASE = (2, K)  # (experts per rank, k) of those calls
GATES = ("the expert outputs were combined without the gate weights: y_i = x_i + sum_j "
         "g_ij * FFN_e_ij(x_i), multiply each returned row by its gate before summing")
RESIDUAL = ("a token dropped by every expert it chose must leave the layer unchanged: "
            "y_i = x_i through the residual, never zero")
NO_DROPS = ("every assignment reached its expert: apply keep_mask with the capacity; "
            "dropped ones add nothing")
STATIC = ("with a capacity the buffers have static sizes: send exactly c slots per expert, "
          "an (E * c, C) tensor padded with zeros, with equal splits")
PER_RANK = ("the experts per rank are shard.local (E / ep), not a fixed number: loop over "
            "range(shard.local) and split the counts into ep blocks of shard.local")
SHAPES = "shapes: x (N, C), gates and experts (N, k); shard.local experts on this rank"
OTHER = ("y matches none of the known mistakes (gates, placement, drops): follow one token "
         "through the seven steps; after the combine, put each row back in token order with "
         "the inverse of the sort (index_copy with the sort order) before weighting")
HANG = ("a collective that only some ranks call, or split sizes that do not match between "
        "ranks: every rank must make the same calls in the same order")


def top_k_hint(k: int) -> str:
    return ("take k from the routing, n, k = experts.shape, not a fixed number: this check "
            f"routes each token to {k} expert{'s' if k > 1 else ''}, not the notebook's {K}")


def configs(per_rank: int, top_k: int) -> list[tuple[int, int]]:
    """(experts per rank, k) of each configuration a check runs, the base first."""
    asked = (per_rank, top_k)
    return [asked] if asked == BASE else [BASE, asked]


def varied(per_rank: int, top_k: int, *, crashed: bool = False) -> str:
    """The likely mistake of a configuration that fails after the base passed (or, `crashed`,
    ran): the quantities that differ from the base, every one named."""
    how = (f"it ran with {BASE[0]} experts per rank and fails with {per_rank}" if crashed else
           f"right with {BASE[0]} experts per rank, wrong with {per_rank}")
    found = ([f"{how}: {PER_RANK}"] if per_rank != BASE[0] else []) + (
        [top_k_hint(top_k)] if top_k != K else [])
    if not found:
        return OTHER
    return found[0] if len(found) == 1 else (
        f"two things differ from {BASE[0]} experts per rank and k = {K}, either: "
        + "; or: ".join(found))
