"""Selective recomputation with torch.utils.checkpoint's default, the reentrant variant: the
same outputs, gradients and bytes, but it recomputes 4bs²h FLOPs instead of 2bs²h, and torch
warns that use_reentrant must be passed. The exercise asks for use_reentrant=False."""

CAUGHT_BY = {"check_recompute": "without use_reentrant=False"}


def recompute_forward(layer, x, recompute):
    p, training, a = layer.p_drop, layer.training, layer.n_heads

    def attention(x):
        b, s, h = x.shape
        qkv = layer.qkv(layer.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        q, k, v = (z.contiguous() for z in qkv)
        if recompute == "selective":  # the mistake: no use_reentrant=False
            y = checkpoint(attention_core, q, k, v, p, training)  # noqa: F821
        else:
            y = attention_core(q, k, v, p, training)  # noqa: F821
        return dropout(layer.proj(y.transpose(1, 2).reshape(b, s, h)), p, training)  # noqa: F821

    def whole(x):
        x = x + attention(x)
        return x + dropout(layer.fc2(F.gelu(layer.fc1(layer.ln2(x)))), p, training)  # noqa: F821

    if recompute == "full":
        return checkpoint(whole, x, use_reentrant=False)  # noqa: F821
    return whole(x)
