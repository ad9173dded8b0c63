"""Module 05. The rank checks run on the first of 2, 3 and 4 ranks an entry fails on
(tests/mistakes.py, Table.runs), with a 5 s launcher timeout here, so
the deadlock costs 5 s, not 20 (tests/test_mistakes_extra.py runs it once under the checks'
own timeout); a mistake must be caught within TIMEOUT + 10 s. An entry's WORLD_SIZES names
the only sizes it fails on (a ring that is right on 2 ranks, where both neighbours are one
rank)."""

from mistakes import Table

from parlab.check import cp as cpcheck

TIMEOUT = 5.0
ON_RANKS = ("check_ring_forward", "check_ring_backward", "check_layouts", "check_ulysses",
            "check_allgather", "check_context_parallel")
CP_TIMEOUT = 20.0  # exercise 7's ranks build DTensors (about 1.3 s of CPU each); no hang entry
TABLE = Table(
    module="05_context_parallel",
    answers=7,
    checks={
        "check_merge": lambda ns, t: cpcheck.check_merge(ns.merge, quiet=True),
        "check_ring_forward": lambda ns, t: cpcheck.check_ring_forward(
            ns.ring_attention, world_size=t, timeout=TIMEOUT, quiet=True),
        "check_ring_backward": lambda ns, t: cpcheck.check_ring_backward(
            ns.ring_attention_backward, world_size=t, timeout=TIMEOUT, quiet=True),
        "check_layouts": lambda ns, t: cpcheck.check_layouts(
            ns.layout_positions, world_size=t, timeout=TIMEOUT, quiet=True),
        "check_ulysses": lambda ns, t: cpcheck.check_ulysses(
            ns.seq_to_heads, ns.heads_to_seq, world_size=t, timeout=TIMEOUT, quiet=True),
        "check_allgather": lambda ns, t: cpcheck.check_allgather(
            ns.allgather_attention, world_size=t, timeout=TIMEOUT, quiet=True),
        # the visible test's two calls: 3 ranks on a 1-D mesh, 4 on a (dp, cp) = (2, 2) one
        "check_context_parallel": lambda ns, t: cpcheck.check_context_parallel(
            ns.cp_attention, world_size=t, mesh=(2, 2) if t == 4 else None,
            timeout=CP_TIMEOUT, quiet=True),
    },
    sizes={**{check: (2, 3, 4) for check in ON_RANKS}, "check_context_parallel": (3, 4)},
    where={check: ("rank ",) for check in ON_RANKS},
    where_exempt=("did not finish",),  # a hang: every rank waits, none is to blame
    max_seconds=TIMEOUT + 10,
    required=frozenset({"lse_merged_in_bf16", "no_max_shift", "mask_on_wrong_block",
                        "recv_before_send", "a2a_wrong_dimension", "cp_seq_dims_heads",
                        "cp_rank_order_gather", "cp_load_balance_on", "cp_mesh_dp"}),
    reexports={
        "merge_alias": ("check_merge", "from parlab.cp import merge_partials as merge"),
        "merge_wrapper": ("check_merge", """
            import parlab.cp
            def merge(out_a, lse_a, out_b, lse_b):
                return parlab.cp.merge_partials(out_a, lse_a, out_b, lse_b)
        """),
        "ring_alias": ("check_ring_forward",
                       "from parlab.cp.ring import ring_attention_forward as ring_attention"),
        "ring_wrapper": ("check_ring_forward", """
            import parlab.cp.ring
            def ring_attention(q, k, v, pos, *, causal):
                return parlab.cp.ring_attention_forward(q, k, v, pos, causal=causal)
        """),
        "ring_function_wrapper": ("check_ring_forward", """
            from parlab.cp import RingAttention
            def ring_attention(q, k, v, pos, *, causal):
                out = RingAttention.apply(q, k, v, pos, causal)
                return out, torch.zeros(q.shape[:-1])
        """),
        "backward_wrapper": ("check_ring_backward", """
            from parlab.cp import ring_attention_backward as reference_backward
            def ring_attention_backward(q, k, v, out, lse, dout, pos, *, causal):
                return reference_backward(q, k, v, out, lse, dout, pos, causal=causal)
        """),
        "layout_alias": ("check_layouts", "from parlab.cp.layout import layout_positions"),
        "layout_wrapper": ("check_layouts", """
            import parlab.cp.layout
            def layout_positions(layout, rank, world_size, seq_len):
                return parlab.cp.layout_positions(layout, rank, world_size, seq_len)
        """),
        "ulysses_alias": ("check_ulysses", "from parlab.cp import seq_to_heads"),
        "ulysses_wrapper": ("check_ulysses", """
            import parlab.cp
            def seq_to_heads(x):
                return parlab.cp.seq_to_heads(x)
        """),
        "ulysses_layer_wrapper": ("check_ulysses", """
            from parlab.cp import ulysses
            def heads_to_seq(y):
                return ulysses.heads_to_seq(y)
        """),
        "allgather_alias": ("check_allgather", "from parlab.cp import allgather_attention"),
        "allgather_wrapper": ("check_allgather", """
            import parlab.cp
            def allgather_attention(q, k, v, pos, doc):
                return parlab.cp.allgather_attention(q, k, v, pos, doc)
        """),
        "allgather_gather_wrapper": ("check_allgather", """
            from parlab.cp import gather_from_context_parallel_region
            class GatherKV(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, pos):
                    return x
                @staticmethod
                def backward(ctx, grad):
                    return grad, None
            def allgather_attention(q, k, v, pos, doc):
                keys = gather_from_context_parallel_region(k, pos)
                values = gather_from_context_parallel_region(v, pos)
                g = q.shape[1] // k.shape[1]
                keys, values = keys.repeat_interleave(g, 1), values.repeat_interleave(g, 1)
                k_pos = torch.arange(pos.numel())
                q_pos = pos[dist.get_rank()]
                mask = (doc[k_pos][None] == doc[q_pos][:, None]) & (k_pos[None] <= q_pos[:, None])
                return torch.nn.functional.scaled_dot_product_attention(q, keys, values,
                                                                        attn_mask=mask)
        """),
        "torch_cp_alias": ("check_context_parallel", "from parlab.cp.torch_cp import "
                           "context_parallel_attention as cp_attention"),
        "torch_cp_wrapper": ("check_context_parallel", """
            import parlab.cp.torch_cp
            def cp_attention(q, k, v, dout, mesh):
                return parlab.cp.torch_cp.context_parallel_attention(q, k, v, dout, mesh)
        """),
        "allgather_sp_gather": ("check_allgather", """
            from parlab.tp import gather_from_sequence_parallel_region
            def allgather_attention(q, k, v, pos, doc):
                keys = gather_from_sequence_parallel_region(k.transpose(1, 2)).transpose(1, 2)
                return q + keys.sum() * 0
        """),
    },
)
