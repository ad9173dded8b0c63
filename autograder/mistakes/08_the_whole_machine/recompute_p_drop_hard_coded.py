"""Mistake: recompute_forward drops out with p = 0.1, the first test's probability,
written in instead of layer.p_drop: right for that layer, wrong for the test cell's second
one, whose layer drops out with 0.25.

Replaces recompute_forward (exercise 2).
"""

CAUGHT_BY = {"check_recompute_4_heads": "read the probability from the layer"}


def recompute_forward(layer, x, recompute):
    p, training, a = 0.1, layer.training, layer.n_heads  # wrong: p = layer.p_drop

    def attention(x):
        b, s, h = x.shape
        qkv = layer.qkv(layer.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        q, k, v = (z.contiguous() for z in qkv)
        if recompute == "selective":
            y = checkpoint(attention_core, q, k, v, p, training,  # noqa: F821
                           use_reentrant=False)
        else:
            y = attention_core(q, k, v, p, training)  # noqa: F821
        return dropout(layer.proj(y.transpose(1, 2).reshape(b, s, h)), p, training)  # noqa: F821

    def whole(x):
        x = x + attention(x)
        return x + dropout(layer.fc2(F.gelu(layer.fc1(layer.ln2(x)))), p,  # noqa: F821
                           training)

    if recompute == "full":
        return checkpoint(whole, x, use_reentrant=False)  # noqa: F821
    return whole(x)
