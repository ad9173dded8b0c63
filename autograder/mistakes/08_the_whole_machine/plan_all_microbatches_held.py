"""The first stage is charged the activations of every micro-batch (GPipe's count), not the
min(p, m) that 1F1B keeps in flight."""

CAUGHT_BY = {"check_plan_70b": "holds min(p, m) micro-batches"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage=stage)
    p = sizes.get("pp", 1)
    if recompute != "full" and stage == "first":
        out["activations"] *= microbatches / min(p, microbatches)  # the mistake
    return out
