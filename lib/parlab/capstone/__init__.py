"""Module 07's capstone: a tiny GPT trained DP × TP on ranks, against the single-device run.

- `train`: the parallel and single-device training loops and their pieces.
- `notebook`: `run_capstone` (ranks, a progress bar, the two loss curves), `plot_losses`.
"""

from parlab.capstone.notebook import plot_losses, read_progress, run_capstone
from parlab.capstone.train import (
    TOLERANCE,
    Replica,
    check_plan,
    local_batch,
    make_optimizer,
    record_progress,
    setup_parallel,
    shard_model,
    sync_gradients,
    train_parallel,
    train_single,
    train_step,
)

__all__ = [
    "TOLERANCE", "check_plan", "shard_model", "local_batch", "sync_gradients", "Replica",
    "setup_parallel", "train_step", "train_parallel", "train_single",
    "make_optimizer", "record_progress", "run_capstone", "plot_losses", "read_progress",
]
