"""Mistake: only the weight is resharded; the moments are handed on as the old pieces were.

Adam's exp_avg and exp_avg_sq have the weight's shape and are cut exactly like it: a resumed
run on t_new ranks needs their t_new pieces too, or its first updates use another rank's
moments (or fail on the shape).

Replaces reshard (exercise).
"""

import torch

CAUGHT_BY = {"check_reshard": "your weight is right but not its exp_avg"}


def reshard(pieces, dim, t_new):
    whole = torch.cat([p["weight"] for p in pieces], dim)
    out = []
    for r, w in enumerate(whole.chunk(t_new, dim)):
        old = pieces[min(r, len(pieces) - 1)]
        out.append({"weight": w.clone(), "exp_avg": old["exp_avg"],  # wrong: not resharded
                    "exp_avg_sq": old["exp_avg_sq"]})
    return out
