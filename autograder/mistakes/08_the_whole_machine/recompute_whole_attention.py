"""Selective recomputation checkpoints the whole attention sublayer (LayerNorm, QKV, core,
projection) instead of the core: it keeps less than 34sbh and recomputes the QKV GEMMs too."""

CAUGHT_BY = {"check_recompute": "you checkpointed more than the attention core"}


def recompute_forward(layer, x, recompute):
    p, training, a = layer.p_drop, layer.training, layer.n_heads

    def attention(x):
        b, s, h = x.shape
        qkv = layer.qkv(layer.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        q, k, v = (z.contiguous() for z in qkv)
        y = attention_core(q, k, v, p, training)  # noqa: F821
        return dropout(layer.proj(y.transpose(1, 2).reshape(b, s, h)), p, training)  # noqa: F821

    def whole(x):
        if recompute == "selective":  # the mistake: the sublayer, not the core
            x = x + checkpoint(attention, x, use_reentrant=False)  # noqa: F821
        else:
            x = x + attention(x)
        return x + dropout(layer.fc2(F.gelu(layer.fc1(layer.ln2(x)))), p, training)  # noqa: F821

    if recompute == "full":
        return checkpoint(whole, x, use_reentrant=False)  # noqa: F821
    return whole(x)
