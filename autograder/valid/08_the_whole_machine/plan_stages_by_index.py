"""Exercise 4's memory written another way: each stage by its index in the pipeline (0 for the
first, p - 1 for the last), the micro-batches 1F1B holds there as min(p - index, m), the loss on
the stage whose index is p - 1 (the only one when p = 1), the logits by `parlab.costs`' closed
form, and the parts of the state from one byte count per parameter."""

from mistake_tables.whole import PLAN_ARGS

from parlab import costs

PASSES = ["check_plan_70b"]
# what the notebook's cells before the exercise define, as tests/mistake_tables/whole.py does
LLAMA3_70B, H100_256 = PLAN_ARGS["model"], PLAN_ARGS["cluster"]
GLOBAL_BATCH = PLAN_ARGS["global_batch"]


def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage):
    d, t, p, c = (sizes.get(k, 1) for k in ("dp", "tp", "pp", "cp"))
    index = {"first": 0, "last": p - 1}[stage]
    layers = -(-model.layers // p)
    vocab_rows = model.vocab * model.hidden
    ends = (index == 0) + (index == p - 1)  # 2 when one stage is both ends
    params = layers * (model.n_params - 2 * vocab_rows) / model.layers + ends * vocab_rows
    per_param = {"weights": 2, "gradients": 2,
                 "optimizer state": 12 / (d * c) if strategy == "zero1" else 12}
    out = {part: n * params / t for part, n in per_param.items()}
    s_c, b, h = model.seq // c, micro_batch, model.hidden
    layer = s_c * b * h * 34 / t
    if recompute == "none":
        layer += 5 * model.heads * s_c * model.seq * b / t
    in_flight = min(p - index, microbatches)
    out["activations"] = (in_flight * layers * 2 * s_c * b * h / t + s_c * b * h * 34 / t
                          if recompute == "full" else in_flight * layers * layer)
    out["logits"] = costs.logits_bytes(b, s_c, model.vocab, t) if index == p - 1 else 0.0
    return out
