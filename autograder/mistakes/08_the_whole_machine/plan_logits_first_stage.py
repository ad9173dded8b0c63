"""The logits charged to every stage, the first one of a pipeline included, where only the
stage that computes the loss keeps them (caught at p > 1, stage="first")."""

CAUGHT_BY = {"check_plan_70b": "the logits live on the last stage"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage="last")  # the mistake: every stage's logits
    first = _memory(model, sizes, strategy=strategy, recompute=recompute,
                    micro_batch=micro_batch, microbatches=microbatches, stage=stage)
    return {**first, "logits": out["logits"]}
