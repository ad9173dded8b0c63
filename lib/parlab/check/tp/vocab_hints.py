r"""The likely mistakes of module 02's vocabulary exercises (7 and 8), and the wrong answers the
parent rebuilds to recognise them: each `*_as_if` computes, from the whole table or logits,
what a known wrong answer returns, so a failure can name the mistake it matches.

Notation: t ranks, n = ⌈V/t⌉ rows (columns) each, rank r holds [r n, (r+1) n); a token's
target y; x its logits (the padded columns past V hold a would-be winner); m its max.
"""

from __future__ import annotations

import torch
from torch import Tensor

SHARD = ("rank r keeps rows r*n .. (r+1)*n - 1 of embedding.weight with n = ceil(V / t), the "
         "last rank's rows past V filled with zeros (the table padded to t * n rows, as "
         "Megatron-LM pads its vocabulary): nn.Parameter(torch.cat([rows, zeros]).clone())")
PADDING = ("t does not divide V here: pad the table to t * ceil(V / t) rows (Megatron-LM "
           "pads the vocabulary the same way), so every rank holds n = ceil(V / t) rows and the "
           "last rank's extra rows are zeros that no id reaches")
PLUS_ONE = ("n = ceil(V / t) = -(-V // t), not V // t + 1: the two differ when t divides V, "
            "where no row is padded")
LOOKUP = ("each id's vector must come from the one rank whose rows hold it: mask the ids "
          "outside [start, end), shift the others by start, look up, zero the masked vectors, "
          "then g (all-reduce forward, identity backward)")
EMBEDDING_GRAD = ("each rank's rows get the gradient of the ids they hold, the padded rows 0: "
                  "with the lookup zeroed outside [start, end) and g (identity backward), "
                  "autograd gives exactly that")
NO_ZERO = ("an id outside this rank's rows looked up row 0 and kept it: after "
           "F.embedding(local, weight), zero the vectors of the ids outside [start, end) "
           "(out.masked_fill(outside.unsqueeze(-1), 0.0)), or the sum over ranks adds t - 1 "
           "stray rows to every token")
NO_SHIFT = ("index the shard with ids - start, this rank's first row subtracted, and send the "
            "ids outside [start, end) to row 0 before the lookup: the shard has only n rows, "
            "numbered from 0")
NO_REDUCE = ("each rank's output holds only the ids of its own rows: all-reduce the partial "
             "outputs with your g from exercise 1 (forward all-reduce, backward identity)")
G_TWICE = ("the weight gradient is t times too large: the backward all-reduced the output's "
           "gradient, which is already whole on every rank; use g (its backward is the "
           "identity), not torch.distributed.nn.functional.all_reduce")
MAX_SHIFT = ("subtract the maximum before exp: exp(x) overflows float32 above about 88, and "
             "these logits reach 1e4; with x - m every exponent is at most 0")
LOCAL_MAX = ("each rank subtracted its own maximum: the sum of exp(x - m) adds up over ranks "
             "only when every rank shifts by the same m. All-reduce the maximum first, "
             "dist.all_reduce(m, op=dist.ReduceOp.MAX)")
TARGET_MASK = ("the target logit was counted on ranks that do not hold the target: take "
               "x[y - start] only where start <= y < end, set it to 0 elsewhere, then "
               "all-reduce (SUM), so that exactly one rank contributes it")
PAD_LOGITS = ("the padded columns past V took part in the softmax: fill the columns at or past "
              "vocab_size with -inf (out of place, logits.masked_fill(cols >= vocab_size, "
              "float('-inf'))) before the max, so they never win and exp gives them 0 (this "
              "course's choice, so that the loss is F.cross_entropy over the real V; "
              "Megatron-LM leaves them in)")
GRAD_OUTPUT = ("the backward dropped its incoming gradient: return (softmax - one_hot) / N "
               "times grad (the gradient of whatever the loss fed into; module 08 divides each "
               "micro-batch's loss by m, so there it is 1/m, not 1)")
NOT_DIVIDED = ("the gradient of the mean has a 1/N: (softmax - one_hot) / N, N the number of "
               "tokens, times the incoming gradient")
GATHER = ("the loss needs three numbers per token from the other ranks (the max, the target "
          "logit and the sum of exponentials), not their logits: all-reduce those (MAX, SUM, "
          "SUM) and keep the logits where they are")
LOSS = ("the loss of token i is log(sum_j exp(x_ij - m_i)) - (x_i,y_i - m_i): m_i all-reduced "
        "with MAX, the sum of exponentials with SUM, and the target logit with SUM from the one "
        "rank that holds y_i")
NOT_MEAN = ("the loss is the mean over tokens, as F.cross_entropy's default: return "
            "per_token.mean(), and in a backward of your own divide by the number of tokens")
BACKWARD = ("the backward of the loss is (softmax - one_hot(target)) / N on the local columns, "
            "times the upstream gradient: the one-hot only on the rank that holds the target, "
            "no communication")
REPLICATED = "return the loss as a 0-dimensional tensor (the mean), the same on every rank"
HANG = ("every rank must make the same all-reduces in the same order, with tensors of the same "
        "shape: one number per token each")


def rows_hint(rows: int, vocab: int, t: int) -> str:
    """Why a rank's table has `rows` rows instead of ceil(V/t), as far as the count says."""
    if rows == vocab // t + 1 and vocab % t == 0:
        return PLUS_ONE
    return PADDING if rows == vocab // t and vocab % t else SHARD


def grad_story(c: float | None, *, up: float, tokens: int, t: int) -> str:
    """The likely mistake of a logits gradient that is c times the right one (None: not a
    multiple): every known mistake that gives this c, all of them named when several do."""
    if c is None or abs(c - 1) < 1e-3:
        return BACKWARD
    stories = [(1 / up, GRAD_OUTPUT), (float(tokens), NOT_DIVIDED),
               (tokens / up, NOT_DIVIDED + "; and " + GRAD_OUTPUT),
               (float(t), G_TWICE.replace("weight", "logits"))]
    found = [h for v, h in stories if abs(c - v) <= 1e-3 * max(1.0, v)]
    if not found:
        return f"the gradient is {c:.4g} times the right one; " + BACKWARD
    return found[0] if len(found) == 1 else (
        "two mistakes give exactly this gradient: either " + "; or ".join(found))


def padded_rows(vocab: int, t: int) -> int:
    """n = ceil(V / t): the rows (columns) of one rank."""
    return -(-vocab // t)


def lookup_not_zeroed(table: Tensor, ids: Tensor, t: int) -> Tensor:
    """The all-reduced output when out-of-shard ids look up row 0 and are not zeroed."""
    vocab, n = table.shape[0], padded_rows(table.shape[0], t)
    padded = torch.cat([table, table.new_zeros(n * t - vocab, table.shape[1])])
    out = torch.zeros(*ids.shape, table.shape[1], dtype=table.dtype)
    for r in range(t):
        inside = (ids >= r * n) & (ids < (r + 1) * n)
        out += padded[torch.where(inside, ids, r * n)]
    return out


def per_token(full: Tensor, target: Tensor, vocab: int, t: int, *, local_max: bool = False,
              unmasked_target: bool = False, padding: bool = False) -> Tensor:
    """The mean loss of a known wrong answer (float64), from the whole padded logits (N, t n)."""
    x = full.double()
    n = x.shape[-1] // t
    if not padding:
        x = x.masked_fill(torch.arange(x.shape[-1]) >= vocab, float("-inf"))
    shards = list(x.split(n, dim=-1))
    glob = x.amax(dim=-1)
    shifts = [s.amax(dim=-1) if local_max else glob for s in shards]
    total = sum((s - m.unsqueeze(-1)).exp().sum(-1) for s, m in zip(shards, shifts, strict=True))
    picked = torch.zeros_like(glob)
    for r, (s, m) in enumerate(zip(shards, shifts, strict=True)):
        inside = (target >= r * n) & (target < (r + 1) * n)
        local = torch.where(inside, target - r * n, 0)
        value = s.gather(-1, local.unsqueeze(-1)).squeeze(-1) - m
        picked += value if unmasked_target else torch.where(inside, value, 0.0)
    return (torch.log(total) - picked).mean()


def loss_story(got: float, full: Tensor, target: Tensor, vocab: int, t: int) -> str | None:
    """The hint of the first wrong answer whose loss `got` matches, if any."""
    for kwargs, hint in (({"local_max": True}, LOCAL_MAX), ({"unmasked_target": True},
                                                            TARGET_MASK),
                         ({"padding": True}, PAD_LOGITS)):
        value = float(per_token(full, target, vocab, t, **kwargs))
        if abs(value - got) <= 1e-4 * max(1.0, abs(value)):
            return hint
    return None
