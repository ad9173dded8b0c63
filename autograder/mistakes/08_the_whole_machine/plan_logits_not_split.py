"""The logits of the whole vocabulary on every TP rank (a gathered loss): 4 b s_c V, not the
4 b s_c V / t of the vocabulary-parallel cross-entropy (caught wherever t > 1)."""

CAUGHT_BY = {"check_plan_70b": "the logits not split over TP"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage=stage)
    out["logits"] *= sizes.get("tp", 1)  # the mistake
    return out
