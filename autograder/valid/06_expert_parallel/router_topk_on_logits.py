"""Top-k taken on the logits, then the softmax gathered at those experts: softmax is
increasing, so the same experts in the same order and the same gates, without sorting the
probabilities; the load counted with scatter_add instead of bincount."""

PASSES = ["check_router"]


def router(x, weight, k):
    logits = x @ weight.t()  # (N, E)
    experts = logits.topk(k, dim=-1).indices  # (N, k), largest first
    probs = torch.softmax(logits, dim=-1)  # noqa: F821
    gates = probs.gather(-1, experts)
    num_experts = weight.shape[0]
    counts = torch.zeros(num_experts, dtype=probs.dtype, device=x.device)  # noqa: F821
    counts.scatter_add_(0, experts.flatten(), torch.ones_like(experts.flatten(),  # noqa: F821
                                                               dtype=probs.dtype))
    aux = num_experts * (counts / experts.numel() * probs.mean(dim=0)).sum()
    return gates, experts, aux
