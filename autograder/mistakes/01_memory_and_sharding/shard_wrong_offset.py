"""Mistake: the shard starts at element `rank` instead of `rank * n`.

Rank 0 is right by luck; every other rank's shard overlaps rank 0's, so the gathered
parameter repeats elements and the layer computes with the wrong weights.

Replaces take_shard (exercise 2).
"""

CAUGHT_BY = {"check_flat_shards": "rank r's shard is elements r*n:(r+1)*n",
             "check_fsdp_layer": "rank r's shard is elements r*n:(r+1)*n"}


def take_shard(flat, rank, t):
    n = flat.numel() // t
    return flat[rank:rank + n].clone()  # wrong offset: rank, not rank * n
