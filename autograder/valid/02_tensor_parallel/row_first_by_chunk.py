"""RowFirstMLP taking this rank's slice with chunk along the last dim instead of the given
own_slice, and the GeLU from an nn.GELU module instead of F.gelu."""

PASSES = ["check_row_first"]


class RowFirstMLP(nn.Module):  # noqa: F821
    def __init__(self, mlp):
        super().__init__()
        self.fc1 = RowParallelLinear(mlp.fc1)  # noqa: F821
        self.fc2 = RowParallelLinear(mlp.fc2)  # noqa: F821
        self.act = nn.GELU()  # noqa: F821

    def forward(self, x):
        rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
        h = self.act(self.fc1(f(x).chunk(t, dim=-1)[rank]))  # noqa: F821
        return self.fc2(f(h).chunk(t, dim=-1)[rank])  # noqa: F821
