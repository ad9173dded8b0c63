"""The DP sync over the whole world instead of grid.dp: OverlappedDDP built with group=None.
Ranks of different stages hold different buckets, so the first stage's ranks wait for a
message the last stage never sends while the last stage waits in an all-reduce the first
never joins. The check must stop as soon as that deadlock is certain (seconds, not its
45 s timeout) and say what each rank waits for."""

CAUGHT_BY = {"check_train_3d": "because the hang is certain: deadlock"}

_base = OverlappedDDP  # noqa: F821


class OverlappedDDP(_base):
    def __init__(self, params, *, group=None, bucket_bytes):
        super().__init__(params, group=None, bucket_bytes=bucket_bytes)  # the mistake: world
