"""Mistake: layers_of gives each rank one contiguous block of layers, cut into v chunks.

Rank r then holds stages r v, ..., r v + v - 1: a microbatch crosses ranks only p - 1 times
and meets a rank's chunks back to back, so interleaving gains nothing. Replaces layers_of
(exercise 3); stage_of is the learner's, right.
"""

CAUGHT_BY = {
    "check_placement": "that is contiguous placement",
}


def layers_of(rank, n_layers, p, v):
    k = n_layers // (p * v)
    return [list(range((rank * v + c) * k, (rank * v + c + 1) * k)) for c in range(v)]
