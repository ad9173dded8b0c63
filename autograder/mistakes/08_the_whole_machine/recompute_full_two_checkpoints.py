"""Full recomputation checkpoints each sublayer separately: it keeps x and the residual
stream between the two sublayers, 4sbh, instead of the layer's input alone."""

CAUGHT_BY = {"check_recompute": "'full' keeps only the layer's input"}

_forward = recompute_forward  # noqa: F821


def recompute_forward(layer, x, recompute):
    if recompute != "full":
        return _forward(layer, x, recompute)
    p, training, a = layer.p_drop, layer.training, layer.n_heads

    def attention(x):
        b, s, h = x.shape
        qkv = layer.qkv(layer.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        q, k, v = (z.contiguous() for z in qkv)
        y = attention_core(q, k, v, p, training)  # noqa: F821
        return x + dropout(layer.proj(y.transpose(1, 2).reshape(b, s, h)), p,  # noqa: F821
                           training)

    def mlp(x):
        return x + dropout(layer.fc2(F.gelu(layer.fc1(layer.ln2(x)))), p, training)  # noqa: F821

    x = checkpoint(attention, x, use_reentrant=False)  # noqa: F821  the mistake: two pieces
    return checkpoint(mlp, x, use_reentrant=False)  # noqa: F821
