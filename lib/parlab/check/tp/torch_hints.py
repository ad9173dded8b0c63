"""What module 02's exercise 9 (`check_torch_tp`) tells a learner: the likely mistake behind each
way a `parallelize_module` plan or a `loss_parallel` loss goes wrong, and the pitfalls of
PyTorch's API by the words of the error it raises. Module 03's exercise 6 shares the ones
about names and layouts (`parlab.check.sp.torch_sp`)."""

from __future__ import annotations

__all__ = ["TORCH_WHAT", "LEFT_OUT", "UNRESOLVED", "SWAPPED", "EMBEDDING_COLS", "HEADS",
           "HEAD_LOCAL", "HEAD_NOT_SHARDED", "OUTSIDE", "BACKWARD_OUTSIDE", "NO_PREPARE",
           "RETURN", "PLAN", "NO_BACKWARD", "error_hint"]

TORCH_WHAT = "parlab.tp.torch_plans (the course's own plans)"
PLAN = ("for each block: parallelize_module(block, mesh, {\"attn\": PrepareModuleInput(...), "
        "\"attn.q\": ColwiseParallel(), ...}); then parallelize_module(model, mesh, {\"tok\": "
        "RowwiseParallel(input_layouts=Replicate()), \"head\": ColwiseParallel(output_layouts="
        "Shard(-1), use_local_output=False)})")
LEFT_OUT = ("the plan left this layer replicated: every rank holds all of it and no style "
            "converts its input or output. Either its name in the plan matches no submodule "
            "(a plan's keys are paths from the module passed to parallelize_module: \"attn.q\" "
            "for a block, \"blocks.0.attn.q\" for the model) or the layer is not in the plan")
UNRESOLVED = ("a key of the plan names no submodule, so parallelize_module skipped it (with "
              "only a warning) and left that layer replicated. A key is a path from the module "
              "you pass: print(model) or dict(model.named_modules()) lists the paths")
SWAPPED = ("ColwiseParallel and RowwiseParallel swapped: ColwiseParallel shards a Linear's "
           "weight by rows, Shard(0) (its output features: q, k, v, fc1, the head), "
           "RowwiseParallel by columns, Shard(1) (its input features: proj, fc2), and the "
           "column layer's sharded output is the row layer's input")
EMBEDDING_COLS = ("ColwiseParallel on nn.Embedding splits its hidden dimension (Shard(1)); "
                  "to split the table over the vocabulary, as your VocabParallelEmbedding "
                  "does, use RowwiseParallel(input_layouts=Replicate()) (Shard(0): rows are "
                  "words)")
HEADS = ("attention reads the width of a head from the tensors: d = q.shape[-1] / n_heads, "
         "and under ColwiseParallel q holds this rank's C/t features, so each attention must "
         "be told its heads per rank: block.attn.n_heads //= t (mesh.size()), after the "
         "block's plan, as your TPAttention's n_heads / t")
HEAD_LOCAL = ("the head's output reached the loss as a plain tensor of this rank's V/t "
              "columns: ColwiseParallel's use_local_output=True (the default) hands on the "
              "local piece. loss_parallel needs the DTensor: ColwiseParallel(output_layouts="
              "Shard(-1), use_local_output=False)")
HEAD_NOT_SHARDED = ("loss_parallel needs the logits sharded over the vocabulary, a DTensor "
                    "with placement Shard(-1); output_layouts=Replicate() all-gathers all V "
                    "logits on every rank first, the bytes loss_parallel exists to save")
OUTSIDE = ("the cross-entropy ran outside loss_parallel(): on DTensor logits F.cross_entropy "
           "then has no sharded rule (a plain target cannot meet them). Compute it inside "
           "`with loss_parallel():`")
BACKWARD_OUTSIDE = ("loss.backward() ran after the `with loss_parallel():` block closed: its "
                    "backward is the parallel one only inside the context. Call "
                    "loss.backward() inside it too")
NO_BACKWARD = "run loss.backward() inside tp_loss, within the loss_parallel() context"
NO_PREPARE = ("each ColwiseParallel of q, k and v wrapped attention's plain input as a "
              "Replicate DTensor of its own, so each all-reduces the gradient it sends back: "
              "three all-reduces where your TPAttention's f makes one. "
              "PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate()) "
              "on \"attn\" hands q, k and v one DTensor, whose gradients meet before one "
              "all-reduce")
RETURN = "parallelize_module shards the module in place and returns it: return the model"

_BY_ERROR = [  # (words of the error, hint): PyTorch's errors for the API's pitfalls
    ("could not be resolved", UNRESOLVED),
    ("nll_loss_forward.default got mixed", OUTSIDE),
    ("nll_loss2d_forward.default got mixed", OUTSIDE),
    ("nll_loss_backward.default got mixed", BACKWARD_OUTSIDE),
    ("nll_loss2d_backward.default got mixed", BACKWARD_OUTSIDE),
    ("requires exactly one mesh dim to shard", HEAD_NOT_SHARDED),
    ("is out of bounds", HEAD_LOCAL),
    ("got mixed torch.Tensor and DTensor", LEFT_OUT),
    ("Sharding propagation failed", SWAPPED),
]


def error_hint(text: str) -> str | None:
    """The likely mistake behind one of PyTorch's errors, by its words; None if unknown."""
    return next((hint for words, hint in _BY_ERROR if words in text), None)
