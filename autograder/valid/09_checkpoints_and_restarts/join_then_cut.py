"""The whole tensor rebuilt with torch.cat along dim, then cut into t_new equal pieces, each
cloned so that it owns its memory: simpler than the overlaps, more memory for a moment."""

import torch

PASSES = ['check_reshard']


def reshard(pieces, dim, t_new):
    out = [{} for _ in range(t_new)]
    for key in pieces[0]:
        whole = torch.cat([p[key] for p in pieces], dim=dim)
        for r, part in enumerate(torch.chunk(whole, t_new, dim=dim)):
            out[r][key] = part.clone()
    return out
