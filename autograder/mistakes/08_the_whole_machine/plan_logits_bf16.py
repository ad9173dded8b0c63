"""The loss's logits counted in bf16, 2 bytes each: the cross-entropy keeps them in fp32."""

CAUGHT_BY = {"check_plan_70b": "the logits counted in bf16"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage=stage)
    out["logits"] /= 2  # the mistake: 2 b s_c V / t
    return out
