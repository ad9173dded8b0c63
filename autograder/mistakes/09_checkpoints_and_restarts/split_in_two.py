"""Mistake: each old piece is split in two, which is right for t 2 -> 4 only.

Written against the visible test (t_old = 2, t_new = 4): it never looks at t_new. For 4 -> 2
it returns 8 pieces; for 2 -> 3 the new pieces straddle old ones and no split of old pieces
gives them.

Replaces reshard (exercise).
"""

CAUGHT_BY = {"check_reshard": "an answer that splits each old piece in two works only for "
                              "t 2 -> 4"}


def reshard(pieces, dim, t_new):
    return [{k: v.chunk(2, dim)[half].clone() for k, v in p.items()}
            for p in pieces for half in range(2)]
