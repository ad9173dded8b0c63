"""Mistake: every strategy divides all 16 bytes by the degree, DDP included.

DDP replicates the whole state; ZeRO-1 and ZeRO-2 shard only part of it.

Replaces state_bytes (exercise 1).
"""

CAUGHT_BY = {"check_state_bytes": "that is zero3's memory"}


def state_bytes(n_params, strategy, dp):
    return 16 * n_params / dp  # wrong: right for zero3 and fsdp only
