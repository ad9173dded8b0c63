"""Not this exercise's layer: the QKV and fc1 GEMMs keep only the shard of their input and
gather it again in backward, as Megatron-LM does.

A right TP + SP layer, and a leaner one (the LayerNorm outputs kept t times smaller), but it
sends two all-gathers more a layer, which exercise 4's bytes do not count. Exercise 3 asks for
the layer whose F.linear keeps the gathered input; section 6 compares the two.

Replaces SPBlock.forward (exercise 3), with a small autograd function of its own.
"""

# ruff: noqa: F821 - the names come from the notebook's cells

CAUGHT_BY = {"check_sp_block": "this exercise builds the layer that keeps the gathered input"}


class _GatheredLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)  # the shard only
        return F.linear(all_gather_sequence(x), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        total = all_gather_sequence(x)  # gathered again
        grad_x = reduce_scatter_sequence(grad @ weight)
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ total.reshape(-1, total.shape[-1])
        return grad_x, grad_w, grad.reshape(-1, grad.shape[-1]).sum(0)


def _forward(self, x, generator):
    q, k, v = _GatheredLinear.apply(self.ln1(x), self.qkv.weight, self.qkv.bias).chunk(3, -1)
    y = attention_heads(q, k, v, self.local_heads, causal=self.causal)
    a = reduce_scatter_seq(F.linear(y, self.proj.weight)) + self.proj.bias
    x = x + sp_dropout(a, self.p_drop, generator)
    u = F.gelu(_GatheredLinear.apply(self.ln2(x), self.fc1.weight, self.fc1.bias))
    m = reduce_scatter_seq(F.linear(u, self.fc2.weight)) + self.fc2.bias
    return x + sp_dropout(m, self.p_drop, generator)


SPBlock.forward = _forward
