"""Module 03. Every check runs on the first of 2, 3 and 4 ranks a mistake fails on
(tests/mistakes.py, Table.runs), at that size for the solutions; the visible tests run 2 and 3
ranks (issue 44: t varied where a learner can see it), the hidden ones 4. A mistake caught only
at 4 must fail the visible test cell too. A rank-level comparison names the rank, a byte
formula (checked in the kernel) the call."""

from mistakes import Table

from parlab.check import sp as spcheck

CHECKS = {
    "check_sp_pair": lambda ns, t: spcheck.check_sp_pair(ns.gather_seq, ns.reduce_scatter_seq,
                                                         world_size=t, quiet=True),
    "check_sp_dropout": lambda ns, t: spcheck.check_sp_dropout(ns.sp_dropout, world_size=t,
                                                               quiet=True),
    # the visible test's second call: another p_drop than the notebook's 0.25 (on 3 ranks)
    "check_sp_dropout_p": lambda ns, t: spcheck.check_sp_dropout(ns.sp_dropout, world_size=t,
                                                                 p_drop=0.1, quiet=True),
    "check_sp_block": lambda ns, t: spcheck.check_sp_block(ns.SPBlock, world_size=t, quiet=True),
    "check_sp_bytes": lambda ns, t: spcheck.check_sp_bytes(ns.SPBlock, ns.sp_layer_bytes,
                                                           world_size=t, quiet=True),
    "check_saved_bytes": lambda ns, t: spcheck.check_saved_bytes(ns.saved_bytes, world_size=t,
                                                                 quiet=True),
}
TABLE = Table(
    module="03_sequence_parallel",
    answers=5,
    checks=CHECKS,
    # the visible test runs 2 ranks, then 3 (the p_drop = 0.1 call: 3 only), the hidden one 4
    sizes={**{check: (2, 3, 4) for check in CHECKS}, "check_sp_dropout_p": (3, 4)},
    solution_sizes={check: (2, 3, 4) for check in CHECKS},
    where={check: ("rank ", "sp_layer_bytes(b=") for check in CHECKS},
    required=frozenset({
        "gather_wrong_dim", "ln_grad_not_reduced", "same_seed_every_rank",  # issue 6
        "dropout_scale_over_p", "dropout_in_place", "fresh_layernorm",  # issue 16
        "hardcoded_hidden", "sp_bytes_no_dtype",
        "dropout_mask_for_two"}),  # issue 44: t varied by the visible tests
    reexports={
        "alias_block": ("check_sp_block", "from parlab.tp.block import SPBlock"),
        "subclass_block": ("check_sp_block", """
            import parlab.tp.block
            class SPBlock(parlab.tp.SPBlock):
                pass
        """),
        "wrapped_block": ("check_sp_block", """
            import parlab.tp.block
            class SPBlock(nn.Module):
                def __init__(self, block):
                    super().__init__()
                    self.inner = parlab.tp.SPBlock.from_block(block)
                    for name in ("ln1", "ln2", "qkv", "proj", "fc1", "fc2"):
                        setattr(self, name, getattr(self.inner, name))
                def forward(self, x, generator):
                    return self.inner(x, generator)
                def reduce_replicated_grads(self):
                    self.inner.allreduce_sequence_parallel_grads()
        """),
        "alias_gather": ("check_sp_pair", "from parlab.tp import "
                         "gather_from_sequence_parallel_region as gather_seq"),
        "wrapped_gather": ("check_sp_pair", """
            import parlab.tp
            def all_gather_sequence(x):
                return parlab.tp.gather_from_sequence_parallel_region(x)
        """),
        "wrapped_dropout": ("check_sp_dropout", """
            import parlab.tp
            def sp_dropout(x, p_drop, generator):
                return parlab.tp.sequence_parallel_dropout(x, p_drop=p_drop, generator=generator)
        """),
        "wrapped_grads": ("check_sp_block", """
            import parlab.tp
            def reduce_replicated_grads(self):
                parlab.tp.allreduce_sequence_parallel_grads(
                    [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias,
                     self.fc2.bias])
            SPBlock.reduce_replicated_grads = reduce_replicated_grads
        """),
        "alias_saved_bytes": ("check_saved_bytes", "from parlab.costs.activations import "
                              "saved_tensor_bytes as saved_bytes"),
        "wrapped_saved_bytes": ("check_saved_bytes", """
            import parlab.costs.activations
            def saved_bytes(fn, *args, exclude=()):
                return parlab.costs.saved_tensor_bytes(fn, *args, exclude=exclude)
        """),
        "alias_sp_bytes": ("check_sp_bytes",
                           "from parlab.tp import sp_bytes_per_layer as sp_layer_bytes"),
        "wrapped_sp_bytes": ("check_sp_bytes", """
            import parlab.tp
            def sp_layer_bytes(b, s, h, t, dtype_bytes=2):
                return parlab.tp.sp_bytes_per_layer(b, s, h, t, dtype_bytes)
        """),
        "ring_helper_sp_bytes": ("check_sp_bytes", """
            from parlab import costs
            def sp_layer_bytes(b, s, h, t, dtype_bytes=2):
                n = b * s * h * dtype_bytes
                return {"all_gather": 4 * costs.ring_allgather_bytes(n, t),
                        "reduce_scatter": 4 * costs.ring_reduce_scatter_bytes(n, t)}
        """),
    },
)
