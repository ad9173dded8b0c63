"""Mistake: fit_state writes in what problem 1's numbers give: plain DP never fits, TP is 8.

On 70B and 32 H100s of 8 a node both are right, so an answer that returns dp_fits = False and
tp = 8 whatever its arguments passes problem 1. The visible test also runs a 1.3B model on 16
GPUs of 4 a node, which plain DP fits (16 P = 20.8 GB <= 40 GB).

Replaces fit_state (exercise 3a, practice problem 1).
"""

CAUGHT_BY = {"check_fit_state": "it fits only if 16 P <= memory"}


def fit_state(n_params, n_gpus, gpu_bytes, gpus_per_node):
    replica = 16 * n_params
    tp = 8  # wrong: a node of problem 1
    return {"replica_bytes": replica, "dp_fits": False,  # wrong: problem 1's answer
            "zero3_bytes": replica / n_gpus, "tp": tp, "dp": n_gpus // tp,
            "tp_only_bytes": replica / tp}
