"""Shape mismatch: rank 0 all-reduces 4 elements, rank 1 only 3.

On gloo this silently hands one rank a wrong tensor. Expected: mean_test scores 0 with
CollectiveMismatch (tensors of different shape); the other tests keep their points.
"""

ANSWERS = {"mean_answer": '''\
def mean_over_ranks(x):
    out = x.clone() if dist.get_rank() == 0 else x[:-1].clone()  # rank 1 drops an element
    dist.all_reduce(out)
    return out / dist.get_world_size()
'''}
EXPECT = {"mean_test": ("CollectiveMismatch", "tensors of different shape")}
MAX_SECONDS = 40
