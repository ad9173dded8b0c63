"""Module 09. The check runs as the hidden test does (quiet=True: every case); its reference
is torch.distributed.checkpoint on 4 ranks, about 6 s, once: the check keeps DCP's pieces of
each case for the process's life, so the later cases start no ranks (t is unused: 1)."""

from mistakes import Table

from parlab.check import checkpoint as ckcheck

TABLE = Table(
    module="09_checkpoints_and_restarts",
    answers=1,
    checks={"check_reshard": lambda ns, t: ckcheck.check_reshard(ns.reshard, quiet=True)},
    sizes={"check_reshard": (1,)},
    required=frozenset({"weight_only", "wrong_dim", "split_in_two", "views_of_whole",
                        "modifies_input", "reversed_order", "returns_one_tensor"}),
    slow_solutions=frozenset({"check_reshard"}),
    refusal="the course's own",
    reexports={
        "wrapped_reshard_pieces": ("check_reshard", """
            from parlab.compose import reshard_pieces
            def reshard(pieces, dim, t_new):
                parts = {k: reshard_pieces([p[k] for p in pieces], dim, t_new) for k in pieces[0]}
                return [{k: parts[k][r] for k in parts} for r in range(t_new)]
        """),
        "alias_reshard_pieces": ("check_reshard",
                                 "from parlab.compose import reshard_pieces as reshard"),
        "dcp_load": ("check_reshard", """
            import torch.distributed.checkpoint as dcp
            def reshard(pieces, dim, t_new):
                dcp.load({}, checkpoint_id="/nonexistent")
        """),
        "dtensor_redistribute": ("check_reshard", """
            from torch.distributed.tensor import DTensor
            def reshard(pieces, dim, t_new):
                return DTensor.redistribute(pieces[0]["weight"])
        """),
    },
)
