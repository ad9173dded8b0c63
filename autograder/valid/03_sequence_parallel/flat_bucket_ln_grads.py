"""The replicated parameters' gradients summed in one bucket: flattened, one all-reduce,
copied back."""

PASSES = ['check_sp_block']


def _reduce_replicated_grads(self):
    params = [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias, self.fc2.bias]
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # noqa: F821
    dist.all_reduce(flat)  # noqa: F821
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


SPBlock.reduce_replicated_grads = _reduce_replicated_grads  # noqa: F821
