"""Mistake: state_bytes returns gigabytes instead of bytes.

Replaces state_bytes (exercise 1); the practice dict (same cell) is recomputed from it.
"""

CAUGHT_BY = {"check_state_bytes": "that is gigabytes"}


def state_bytes(n_params, strategy, dp):
    sharded = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
               "zero3": ("optimizer", "grads", "weights"),
               "fsdp": ("optimizer", "grads", "weights")}[strategy]
    per_param = {"weights": 2, "grads": 2, "optimizer": 12}
    total = sum(b * n_params / (dp if part in sharded else 1) for part, b in per_param.items())
    return total / 1e9  # wrong: GB


practice = {"ddp_per_gpu": state_bytes(70e9, "ddp", 32),
            "zero3_per_gpu": state_bytes(70e9, "zero3", 32),
            "ddp_fits": False, "zero3_fits": True}
