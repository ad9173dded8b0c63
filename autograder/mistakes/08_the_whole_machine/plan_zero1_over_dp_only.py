"""ZeRO-1 shards the optimizer over dp only, forgetting that with CP the dense weights' DP group
is the dp·cp ranks."""

CAUGHT_BY = {"check_plan_70b": "divided by the dp·cp ranks that share it under zero1"}

_memory = memory_per_gpu  # noqa: F821


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    out = _memory(model, sizes, strategy=strategy, recompute=recompute, micro_batch=micro_batch,
                  microbatches=microbatches, stage=stage)
    if strategy == "zero1":
        out["optimizer state"] *= sizes.get("cp", 1)  # the mistake: 12 P_0 / t / dp
    return out
