"""The RMSNorm gradients are never summed over TP: under SP each rank's copy saw only its own
tokens, so the copies take different steps and the loss drifts from step 1."""

CAUGHT_BY = {"check_train_3d": "the TP ranks hold different RMSNorm weights"}
SIZES = {"check_train_3d": (8,)}


def allreduce_sequence_parallel_grads(params, *, group=None):
    pass  # the mistake: the partial sums stay partial
