"""Recomputation written another way: the core checkpointed through functools.partial (the
dropout probability and the training flag bound, q, k, v passed), the whole layer through a
partial of a function of (layer, x); q, k and v split by unflatten and unbind, then moved to
(b, a, s, h/a) and made contiguous; the formula factored as s b (34 h + 5 a s) + 8 s b."""

import functools

PASSES = ["check_recompute"]


def _attention_block(layer, x, selective):
    b, s, h = x.shape
    a = layer.n_heads
    qkv = layer.qkv(layer.ln1(x)).unflatten(-1, (3, a, h // a))  # (b, s, 3, a, h/a)
    q, k, v = (z.transpose(1, 2).contiguous() for z in qkv.unbind(2))  # 3 x (b, a, s, h/a)
    core = functools.partial(attention_core, p_drop=layer.p_drop,  # noqa: F821
                             training=layer.training)
    y = checkpoint(core, q, k, v, use_reentrant=False) if selective else core(q, k, v)  # noqa: F821
    return dropout(layer.proj(y.transpose(1, 2).reshape(b, s, h)),  # noqa: F821
                   layer.p_drop, layer.training)


def _layer(layer, x, selective):
    x = x + _attention_block(layer, x, selective)
    mlp = layer.fc2(F.gelu(layer.fc1(layer.ln2(x))))  # noqa: F821
    return x + dropout(mlp, layer.p_drop, layer.training)  # noqa: F821


def recompute_forward(layer, x, recompute):
    if recompute == "full":
        return checkpoint(functools.partial(_layer, layer, selective=False), x,  # noqa: F821
                          use_reentrant=False)
    return _layer(layer, x, selective=recompute == "selective")


def saved_bytes_formula(b, s, h, a, recompute):
    if recompute == "full":
        return 2 * s * b * h
    scores = 5 * a * s if recompute == "none" else 0
    return s * b * (34 * h + scores) + 8 * s * b
