"""A forgotten `return`: the mean is computed on every rank but never handed back.

A common slip, and one the check diagnoses. Expected: mean_test scores 0 with parlab's
CheckFailed, saying the result should be a tensor and got None, with the diagnosis "Likely
mistake: return the tensor you computed" (counted by the class report); the other tests keep
their points.
"""

ANSWERS = {"mean_answer": '''\
def mean_over_ranks(x):
    out = x.clone()
    dist.all_reduce(out)
    out = out / dist.get_world_size()
'''}
EXPECT = {"mean_test": ("CheckFailed", "should be a tensor of shape (4,), got NoneType")}
MAX_SECONDS = 40
