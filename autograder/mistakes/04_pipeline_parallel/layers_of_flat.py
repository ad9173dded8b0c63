"""Mistake: layers_of returns one flat list of the rank's layers instead of one list per chunk.

Replaces layers_of (exercise 3); stage_of is the learner's, right. The layers are the right
ones, but [0, 1, 4, 5] instead of [[0, 1], [4, 5]]: the check used to index it as a list of
lists and crashed with "TypeError: 'int' object is not iterable"; it now says what it expected
(issue 16.7).
"""

CAUGHT_BY = {
    "check_placement": "expected a list of v = 2 lists of layer indices",
}


def layers_of(rank, n_layers, p, v):
    k = n_layers // (p * v)
    layers = []
    for c in range(v):
        s = stage_of(rank, c, p)  # noqa: F821
        layers += list(range(s * k, (s + 1) * k))  # wrong: one flat list
    return layers
