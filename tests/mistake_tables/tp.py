"""Module 02. Every check runs on the first of 2 and 4 ranks a mistake fails on
(tests/mistakes.py, Table.runs), at that size for the solutions (2, 3 and 4 in the course
run's hidden tests); the `OTHER_SIZES` ones as the visible tests' second calls make them; a
rank-level comparison names the rank, a byte formula (checked in the kernel) the call."""

from mistakes import Table

from parlab.check import tp as tpcheck

CHECKS = {
    "check_f_g": lambda ns, t: tpcheck.check_f_g(ns.f, ns.g, world_size=t, quiet=True),
    "check_parallel_linears": lambda ns, t: tpcheck.check_parallel_linears(
        ns.ColumnParallelLinear, ns.RowParallelLinear, world_size=t, quiet=True),
    "check_tp_mlp": lambda ns, t: tpcheck.check_tp_mlp(ns.TPMLP, world_size=t, quiet=True),
    "check_row_first": lambda ns, t: tpcheck.check_row_first(ns.RowFirstMLP, world_size=t,
                                                             quiet=True),
    "check_tp_attention": lambda ns, t: tpcheck.check_tp_attention(ns.TPAttention,
                                                                   world_size=t, quiet=True),
    "check_tp_block": lambda ns, t: tpcheck.check_tp_block(ns.TPBlock, ns.layer_bytes,
                                                           world_size=t, quiet=True),
    "check_vocab_embedding": lambda ns, t: tpcheck.check_vocab_embedding(
        ns.VocabParallelEmbedding, world_size=t, vocab=(37, 36), quiet=True),
    "check_vocab_cross_entropy": lambda ns, t: tpcheck.check_vocab_cross_entropy(
        ns.vocab_parallel_cross_entropy, world_size=t, vocab=(37, 36), quiet=True),
}
# as the visible tests' second calls make them: other sizes (issue 32.6), attention without
# the causal mask (issue 44.1); the vocabulary checks above run V = 37 and 36, as theirs do
OTHER_SIZES = {
    "check_parallel_linears_other_sizes": lambda ns, t: tpcheck.check_parallel_linears(
        ns.ColumnParallelLinear, ns.RowParallelLinear, world_size=t, features=(7, 15),
        quiet=True),
    "check_tp_attention_other_sizes": lambda ns, t: tpcheck.check_tp_attention(
        ns.TPAttention, world_size=t, hidden=40, heads=10, causal=False, quiet=True),
}
OTHER_WORLD = {"check_parallel_linears_other_sizes": (3,), "check_tp_attention_other_sizes": (2,)}
TABLE = Table(
    module="02_tensor_parallel",
    answers=8,
    checks={**CHECKS, **OTHER_SIZES},
    sizes={**{check: (2, 4) for check in CHECKS}, **OTHER_WORLD},
    solution_sizes={**{check: (2, 3, 4) for check in CHECKS}, **OTHER_WORLD},
    where={check: ("rank ", "layer_bytes(b=") for check in (*CHECKS, *OTHER_SIZES)},
    required=frozenset({
        "missing_backward_allreduce", "allreduce_twice", "wrong_shard", "bias_every_rank",
        "swapped_order",
        "extra_g", "gelu_forgotten", "swapped_layers",  # issue 15.2
        "extra_f",  # 16.8
        "shard_view", "hardcoded_heads", "fresh_layernorm", "residual_in_place",  # 16
        "layer_bytes_forward_only",  # 16.8, two mistakes with one formula
        "vocab_lookup_not_zeroed", "vocab_ids_not_shifted", "vocab_rows_not_padded",  # 33.1
        "ce_no_max_shift", "ce_local_max", "ce_target_every_rank", "ce_padding_counted",
        "ce_all_gather_logits",
        "linears_size_hard_coded", "attention_hidden_hard_coded",  # 32.6
        "ce_backward_drops_grad_output", "g_reduces_with_max", "attention_always_causal",
        "vocab_rows_plus_one"}),  # 44.1: what a right answer must not depend on
    reexports={
        "alias": ("check_tp_mlp", "from parlab.tp import TPMLP"),
        "subclass": ("check_tp_mlp", """
            import parlab.tp
            class TPMLP(parlab.tp.TPMLP):
                pass
        """),
        "wrapper": ("check_tp_mlp", """
            import parlab.tp
            class TPMLP(nn.Module):
                def __init__(self, mlp):
                    super().__init__()
                    inner = parlab.tp.TPMLP.from_mlp(mlp)
                    self.fc1, self.fc2 = inner.fc1, inner.fc2
                def forward(self, x):
                    return self.fc2(F.gelu(self.fc1(x)))
        """),
        "function": ("check_f_g", "from parlab.tp import copy_to_tp_region as f"),
        "wrapped_function": ("check_f_g", """
            import parlab.tp
            def f(x):
                return parlab.tp.copy_to_tp_region(x)
        """),
        "vocab_alias": ("check_vocab_embedding",
                        "from parlab.tp import VocabParallelEmbedding"),
        "vocab_loss_wrapper": ("check_vocab_cross_entropy", """
            import parlab.tp
            def vocab_parallel_cross_entropy(logits_shard, target, vocab_size):
                return parlab.tp.vocab_parallel_cross_entropy(logits_shard, target,
                                                              vocab_size=vocab_size)
        """),
        "bytes_alias": ("check_tp_block",
                        "from parlab.costs import tp_bytes_per_layer as layer_bytes"),
        "bytes_wrapper": ("check_tp_block", """
            import parlab.costs
            def layer_bytes(b, s, h, t, dtype_bytes=2):
                return parlab.costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes)
        """),
        "bytes_ring_helper": ("check_tp_block", """
            from parlab import costs
            def layer_bytes(b, s, h, t, dtype_bytes=2):
                return 4 * costs.ring_allreduce_bytes(b * s * h * dtype_bytes, t)
        """),
    },
    refusal="the course's own reference",
    # a wrapper is refused with the words of a re-export, naming the function it used
    refusal_starts={
        "bytes_alias": r"your answer uses parlab\.costs\..*tp_bytes_per_layer",
        "bytes_wrapper": r"your answer uses parlab\.costs\..*tp_bytes_per_layer",
        "bytes_ring_helper": r"your answer uses parlab\.costs\..*ring_allreduce_bytes"},
)
