"""The capacity as an integer ceiling of the same product, and the keep mask by plain loops:
choices in serving order (choice j of every token, then choice j + 1), a running count per
expert, instead of one_hot and cumsum."""

PASSES = ["check_capacity"]


def expert_capacity(n_tokens, num_experts, k, capacity_factor):
    slots = capacity_factor * n_tokens * k / num_experts
    return int(slots) + (int(slots) < slots)


def keep_mask(experts, num_experts, capacity):
    n, k = experts.shape
    keep = torch.zeros((n, k), dtype=torch.bool)  # noqa: F821
    served = [0] * num_experts
    for j in range(k):
        for i in range(n):
            e = int(experts[i, j])
            keep[i, j] = served[e] < capacity
            served[e] += 1
    return keep.to(experts.device)
