"""Mistake: recompute_forward with the number of heads written in as the visible test's 3.

`a = 3` instead of layer.n_heads is right for the visible test's layer (3 heads) and runs
without an error on any hidden size 3 divides: the hidden test's layer has 4 heads on h = 24,
so the answer computes attention with 3 heads of 8 features instead of 4 of 6, and its output
is that of a 3-head layer.

Replaces recompute_forward (exercise 2).
"""

CAUGHT_BY = {"check_recompute_4_heads": "take every size from the arguments"}


def recompute_forward(layer, x, recompute):
    p, training, a = layer.p_drop, layer.training, 3  # wrong: a = layer.n_heads

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
