"""Megatron-style tensor and sequence parallelism: the reference layers of modules 02 and 03.

- `mappings`: the communication operators, named for the way data moves: f and g
  (`copy_to_tp_region`, `reduce_from_tp_region`), their gather/scatter cousins and the
  sequence-parallel pair (`gather_from_sequence_parallel_region`,
  `reduce_scatter_to_sequence_parallel_region`).
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, `TPMLP`.
- `attention`: `TPAttention` (split by heads), `TPBlock`, `heads_first_qkv`.
- `sequence`: dropout on sequence shards, the LayerNorm-gradient all-reduce, SP bytes.
- `block`: a layer with hidden dropout, `DropoutBlock` (one device) and `SPBlock` (TP + SP).
- `regather`: `gathered_linear`, a column-parallel GEMM that keeps only its sequence shard and
  gathers it again in backward (Megatron's; `SPBlock(regather=True)`).
- `vocab`: the vocabulary split over the group: `VocabParallelEmbedding`,
  `vocab_parallel_cross_entropy` (the loss without gathering the logits; the padded logits
  masked, this course's choice), `padded_vocab_size` (Megatron-LM's padding) and the bytes of
  the logits against those of the loss.
"""

from parlab.tp.attention import TPAttention, TPBlock, heads_first_qkv
from parlab.tp.block import DropoutBlock, SPBlock
from parlab.tp.layers import TPMLP, ColumnParallelLinear, RowParallelLinear
from parlab.tp.mappings import (
    SEQ_DIM,
    copy_to_tp_region,
    divisible,
    gather_from_sequence_parallel_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tp_region,
    tp_rank_and_size,
)
from parlab.tp.regather import gathered_linear
from parlab.tp.sequence import (
    allreduce_sequence_parallel_grads,
    column_shard,
    dropout_keep_mask,
    hidden_dropout,
    row_shard,
    sequence_parallel_dropout,
    sp_bytes_per_layer,
)
from parlab.tp.vocab import (
    VocabParallelEmbedding,
    gathered_logits_bytes,
    padded_vocab_size,
    vocab_parallel_cross_entropy,
    vocab_parallel_loss_bytes,
    vocab_range,
)

__all__ = [
    "tp_rank_and_size", "divisible", "copy_to_tp_region", "reduce_from_tp_region",
    "gather_from_tp_region", "scatter_to_tp_region", "SEQ_DIM",
    "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "ColumnParallelLinear", "RowParallelLinear", "TPMLP",
    "heads_first_qkv", "TPAttention", "TPBlock", "dropout_keep_mask", "hidden_dropout",
    "sequence_parallel_dropout", "allreduce_sequence_parallel_grads", "column_shard", "row_shard",
    "sp_bytes_per_layer", "DropoutBlock", "SPBlock", "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy", "padded_vocab_size", "vocab_range",
    "vocab_parallel_loss_bytes", "gathered_logits_bytes", "gathered_linear",
]
