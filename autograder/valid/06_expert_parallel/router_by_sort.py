"""Top-k by sorting the probabilities (descending) and keeping the first k columns, the
load term counted with one_hot instead of bincount."""

PASSES = ["check_router"]


def router(x, weight, k):
    probs = torch.softmax(x @ weight.t(), dim=-1)  # noqa: F821  (N, E)
    order = torch.argsort(probs, dim=-1, descending=True)[:, :k]  # noqa: F821
    gates = torch.gather(probs, -1, order)  # noqa: F821
    num_experts = weight.shape[0]
    hits = torch.nn.functional.one_hot(order, num_experts).sum(dim=(0, 1))  # noqa: F821
    f = hits.to(probs.dtype) / order.numel()
    aux = num_experts * (f * probs.mean(dim=0)).sum()
    return gates, order, aux
