"""Mistake: saved_bytes adds up numel() * element_size() of every tensor the hook sees.

A tensor saved twice (x * x) is counted twice, and a view is counted at its own size although
it keeps its whole storage alive. What autograd holds is storages: count each once.

Replaces saved_bytes (exercise 5).
"""

import torch

CAUGHT_BY = {
    "check_saved_bytes": "count each storage once",
}


def saved_bytes(fn, *args, exclude=()):
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    total = 0

    def pack(tensor):
        nonlocal total
        if tensor.untyped_storage().data_ptr() not in skip:
            total += tensor.numel() * tensor.element_size()  # wrong: per tensor, not storage
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*args)
    return total
