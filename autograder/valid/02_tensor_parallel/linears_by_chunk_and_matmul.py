"""The parallel linears with their shards cut by torch.chunk and the products written as
x @ W.T (+ b) instead of F.linear."""

PASSES = ["check_parallel_linears"]


class ColumnParallelLinear(nn.Module):  # noqa: F821
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
        self.weight = nn.Parameter(linear.weight.detach().chunk(t, dim=0)[rank].clone())  # noqa: F821
        self.bias = nn.Parameter(linear.bias.detach().chunk(t)[rank].clone())  # noqa: F821

    def forward(self, x):
        return f(x) @ self.weight.T + self.bias  # noqa: F821


class RowParallelLinear(nn.Module):  # noqa: F821
    def __init__(self, linear):
        super().__init__()
        rank, t = dist.get_rank(), dist.get_world_size()  # noqa: F821
        self.weight = nn.Parameter(linear.weight.detach().chunk(t, dim=1)[rank].clone())  # noqa: F821
        self.bias = nn.Parameter(linear.bias.detach().clone())  # noqa: F821

    def forward(self, x):
        return g(x @ self.weight.T) + self.bias  # noqa: F821
