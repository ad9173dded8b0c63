"""What module 03's exercise 6 (`check_torch_sp`) tells a learner, beside the API's pitfalls it
shares with module 02's (`parlab.check.tp.torch_hints`)."""

from __future__ import annotations

__all__ = ["PLAN", "NORMS", "OUTPUT", "NO_PREPARE", "TP_OUTPUT", "error_hint"]

PLAN = ("the plan of a layer under TP + SP: {\"ln1\": SequenceParallel(), \"attn\": "
        "PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()), "
        "\"attn.q\", \"attn.k\", \"attn.v\": ColwiseParallel(), \"attn.proj\": "
        "RowwiseParallel(output_layouts=Shard(1)), and the same for ln2, mlp, mlp.fc1, "
        "mlp.fc2}; then block.attn.n_heads //= t")
NORMS = ("SequenceParallel() on ln1 and ln2: it makes their weight and bias Replicate() "
         "DTensors, so that the gradient each rank computes from its own tokens is summed over "
         "the ranks, as your reduce_replicated_grads does; left out, each rank keeps only its "
         "tokens' share")
OUTPUT = ("a layer takes and returns this rank's (B, T/t, C) tokens as a plain tensor: "
          "RowwiseParallel(output_layouts=Shard(1)) with its default use_local_output=True "
          "hands back the local piece of its reduce-scatter")
NO_PREPARE = ("SequenceParallel hands the LayerNorm's output on as a Shard(1) DTensor, and each "
              "ColwiseParallel (q, k, v) given that sequence shard all-gathers it itself: "
              "three all-gathers into attention where your SPBlock makes one, and again in "
              "backward. Either \"attn\" and \"mlp\" have no PrepareModuleInput, or it was told "
              "input_layouts=Replicate() (it redistributes only from the layout it is told to "
              "the one wanted, so the shard passes through): PrepareModuleInput(input_layouts="
              "Shard(1), desired_input_layouts=Replicate()) gathers once for all of them")
TP_OUTPUT = ("the tokens do not line up: either RowwiseParallel() lacks output_layouts=Shard(1) "
             "and all-reduces its output to all T tokens (plain TP's g) while the residual "
             "holds this rank's T/t, or a LayerNorm's output reached attention as a plain "
             "(B, T/t, C) tensor taken for the whole sequence (SequenceParallel("
             "use_local_output=True) without PrepareModuleInput). SP's g is RowwiseParallel("
             "output_layouts=Shard(1)); its f is PrepareModuleInput(input_layouts=Shard(1), "
             "desired_input_layouts=Replicate())")

_BY_ERROR = [
    ("must match the size of tensor", TP_OUTPUT),
]


def error_hint(text: str) -> str | None:
    """module 03's words for an error first, module 02's (the API's pitfalls) after."""
    from parlab.check.tp.torch_hints import error_hint as tp_hint

    return next((hint for words, hint in _BY_ERROR if words in text), None) or tp_hint(text)
