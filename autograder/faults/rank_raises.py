"""One rank raises: rank 1 fails before the collective its peer is waiting in.

Expected: mean_test scores 0 with RankError naming rank 1 and its ValueError (not the peer's
broken connection); the other tests keep their points.
"""

ANSWERS = {"mean_answer": '''\
def mean_over_ranks(x):
    if dist.get_rank() == 1:
        raise ValueError("rank 1 cannot average")
    out = x.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()
'''}
EXPECT = {"mean_test": ("RankError", "rank 1 raised ValueError: rank 1 cannot average")}
MAX_SECONDS = 40
