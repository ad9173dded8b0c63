"""Mistake: take_shard returns a slice of the flat vector, not a copy of it.

`flat[a:b]` is a view: it shares the flat vector's storage, so the shard keeps all P elements
alive (nn.Parameter(view) shares it too) and every rank still holds the whole parameter: the
memory FSDP was meant to save. The values are right.

Replaces take_shard (exercise 2).
"""

CAUGHT_BY = {"check_flat_shards": "a view keeps the whole flat vector alive",
             "check_fsdp_layer": "a view keeps the whole flat vector alive"}


def take_shard(flat, rank, t):
    n = flat.numel() // t
    return flat[rank * n:(rank + 1) * n]  # wrong: a view, no .clone()
