"""The DP sync sums the replicas' gradients (sum_grads over grid.dp with no scale) instead of
averaging them: invisible under Adam, a wrong step at once under the check's plain SGD."""

CAUGHT_BY = {"check_train_3d": "step 0's loss is right and later ones drift"}

_base = OverlappedDDP  # noqa: F821


class OverlappedDDP(_base):
    def __init__(self, params, *, group=None, bucket_bytes):
        super().__init__(params, group=group, bucket_bytes=bucket_bytes)
        self.size = 1  # the mistake: the sum over DP, not the mean
