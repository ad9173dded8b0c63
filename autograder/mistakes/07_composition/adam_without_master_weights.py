"""Mistake: a replica is priced at 12 bytes per parameter, forgetting the fp32 master weights.

Mixed-precision Adam keeps bf16 weights (2 bytes) and gradients (2), and in fp32 the master
copy of the weights and both moments (4 + 4 + 4 = 12): 16 bytes per parameter. Counting only
the two moments (8) gives 2 + 2 + 8 = 12.

Replaces fit_state (exercise 3, practice problem 1).
"""

CAUGHT_BY = {"check_fit_state": "2 + 2 + 12 = 16 bytes per parameter"}


def fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node):
    replica = (2 + 2 + 8) * n_params  # wrong: Adam's m and v, but no fp32 master copy
    tp = gpus_per_node
    return {"replica_bytes": replica, "dp_fits": replica <= gpu_bytes,
            "zero3_bytes": replica / n_gpus, "tp": tp, "dp": n_gpus // tp,
            "tp_only_bytes": replica / tp}
