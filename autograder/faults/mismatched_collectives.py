"""Ranks call different collectives: rank 0 all-reduces while rank 1 broadcasts.

gloo alone would wait for its timeout (30 minutes by default). Expected: mean_test scores 0
at once with CollectiveMismatch, naming both collectives; the other tests keep their points.
"""

ANSWERS = {"mean_answer": '''\
def mean_over_ranks(x):
    out = x.clone()
    if dist.get_rank() == 0:
        dist.all_reduce(out)
    else:
        dist.broadcast(out, src=0)
    return out / dist.get_world_size()
'''}
EXPECT = {"mean_test": ("CollectiveMismatch", "collectives that do not match")}
MAX_SECONDS = 40
