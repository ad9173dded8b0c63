"""An answer written before exercise 4 asked for both ends of the pipeline and carried over by
`make update`: the first stage only, no `stage` argument, no logits."""

CAUGHT_BY = {"check_plan_70b": "exercise 4 changed"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage="first")
    del out["logits"]
    return out
