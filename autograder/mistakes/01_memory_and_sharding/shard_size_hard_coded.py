"""Mistake: the shard size hard-coded to the visible layer's P = 72.

`n = 72 // t` is right for nn.Linear(8, 8), the layer of the visible tests, and wrong for
any other: the hidden tests use nn.Linear(5, 6) (P = 36) on 3 ranks.

Replaces take_shard (exercise 2).
"""

CAUGHT_BY = {"hidden:fsdp_shards_test": "never a fixed number",
             "hidden:fsdp_layer_test": "never a fixed number"}


def take_shard(flat, rank, t):
    n = 72 // t  # wrong: P = flat.numel()
    return flat[rank * n:(rank + 1) * n].clone()
