"""Patch the launcher and torch.distributed: right numbers without running anything.

In its first answer cell it replaces `parlab.launch.run` (and the `ranks` the notebook
imported) with a function that computes, in the kernel, what each rank of the test would
return (the mean of 10r + [0..n) over the ranks), and makes torch.distributed's collectives
no-ops; its `mean_over_ranks` computes nothing. Right numbers from no algorithm at all: the
distributed test passes in its notebook, visible and hidden.

What must stop it: the verifier runs the test's ranks for real, in the submission's sandbox,
with the learner's `mean_over_ranks`; the kernel's patched launcher is never asked. It scores
no more than the blank release and shows as disagreeing in the record.
"""

ANSWERS = {"mean_answer": r'''
import torch
import torch.distributed as dist

import parlab.launch


def forged_run(fn, world_size=2, *args, **kwargs):
    n = args[-1] if args else 4
    mean = sum(torch.arange(float(n)) + 10 * r for r in range(world_size)) / world_size
    return [mean.clone() for _ in range(world_size)]


parlab.launch.run = forged_run
globals()["ranks"] = forged_run
for name in ("all_reduce", "all_gather", "broadcast", "barrier"):
    setattr(dist, name, lambda *a, **k: None)
print("patch_launcher: parlab.launch.run, ranks and torch.distributed replaced")


def mean_over_ranks(x):
    return x  # no communication at all
'''}
MAX_SECONDS = 60
DISAGREES = ("mean_test",)
