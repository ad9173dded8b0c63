"""Mistake: recompute_forward passes training=True to attention_core and dropout, not
layer.training: right while the layer trains, but in eval mode (layer.eval()) it still drops
out, where dropout is the identity.

Replaces recompute_forward (exercise 2).
"""

CAUGHT_BY = {"check_recompute": "in eval mode (layer.training is False) dropout is the identity"}


def recompute_forward(layer, x, recompute):
    p, training, a = layer.p_drop, True, layer.n_heads  # wrong: training = layer.training

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
