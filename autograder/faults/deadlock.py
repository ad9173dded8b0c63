"""Deadlock: one rank skips the all-reduce that the other makes.

Expected: mean_test scores 0 with parlab's CollectiveTimeout, which says that a rank waits in
all_reduce while the other returned without making it; the other tests keep their points.
The launcher sees the hang for sure after about a second, long before any timeout.
"""

ANSWERS = {"mean_answer": '''\
def mean_over_ranks(x):
    out = x.clone()
    if dist.get_rank() == 0:  # rank 1 never joins this all-reduce
        dist.all_reduce(out)
    return out / dist.get_world_size()
'''}
EXPECT = {"mean_test": ("CollectiveTimeout", "skipped a collective")}
MAX_SECONDS = 40
