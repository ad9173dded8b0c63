"""The last stage charged the first stage's min(p, m) micro-batches of activations: under 1F1B
it holds one, starting each backward right after its forward (caught at p > 1)."""

CAUGHT_BY = {"check_plan_70b": "charged the first stage's min(p, m) micro-batches"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage=stage)
    first = _memory(model, sizes, strategy=strategy, recompute=recompute,
                    micro_batch=micro_batch, microbatches=microbatches, stage="first")
    return {**out, "activations": first["activations"]}  # the mistake
