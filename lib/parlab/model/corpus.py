"""The capstone's training text: a small synthetic corpus shipped with parlab, and its batches.

    from parlab.model import batch, load_corpus

    tokens, vocab = load_corpus()      # LongTensor of 14,528 word ids; 254 words
    x, y = batch(tokens, step=3, batch_size=8, seq=32)   # (8, 32) inputs, (8, 32) next words

How `data/corpus.txt` was made (once; the generator is not kept): a seeded
`random.Random(2024)` drew 330 lines of 3 to 6 sentences from eight templates over fixed word
lists: "<subject> eats/cooks/buys ... <food> [<time>] .", "<person> reads/writes ... <thing>
in the <place> .", "<person> uses ... <tool> and <he/she> goes to the <place> .", "<subject>
walks/runs ... to the <place> because <he/she/it> is <mood> .", "the <animal> <its own sound>
at <person> .", "when it is <weather> , <person> stays in the <place> and <he/she> is
<mood> .", "<number> <animal plural> sleep in the <place> <time> .", "<person> gives <object>
to <person> .". There is structure to learn: each animal has its sound (dog barks, owl hoots),
a pronoun agrees with its subject's name, plurals follow the number, only people cook or read.
The text is lower case and every word and punctuation mark is separated by one space, so a
word-level tokenizer is `text.split()`: about 64 KB, a vocabulary of 254 words.

Token ids are positions in the sorted vocabulary, so they depend only on the text. A batch is
a function of (step, seed) alone: every rank that asks for step 7 gets the same global batch
and then keeps its own rows of it (`parlab.capstone.local_batch`).
"""

from __future__ import annotations

from importlib import resources

import torch
from torch import Tensor

__all__ = ["load_corpus", "batch", "CORPUS_FILE"]

CORPUS_FILE = "data/corpus.txt"  # beside this file, in parlab.model


def load_corpus() -> tuple[Tensor, list[str]]:
    """(tokens, vocab): the corpus as word ids (N,) and the sorted list of its words."""
    text = resources.files("parlab.model").joinpath(CORPUS_FILE).read_text(encoding="utf-8")
    words = text.split()
    vocab = sorted(set(words))
    index = {w: i for i, w in enumerate(vocab)}
    return torch.tensor([index[w] for w in words], dtype=torch.long), vocab  # (N,)


def batch(tokens: Tensor, step: int, *, batch_size: int, seq: int,
          seed: int = 0) -> tuple[Tensor, Tensor]:
    """The global batch of `step`: `batch_size` windows of `seq` words and the words after them.

    Window starts are drawn from a generator seeded by (seed, step) only, never from the
    global random state, so the answer is the same on every rank and in every process.
    Returns x, y, both (batch_size, seq), with y[b, t] = tokens[start_b + t + 1].
    """
    if seq < 1 or batch_size < 1:
        raise ValueError(f"batch_size={batch_size} and seq={seq} must both be at least 1")
    if seq + 1 > len(tokens):
        raise ValueError(f"seq={seq} needs at least {seq + 1} tokens, the corpus has "
                         f"{len(tokens)}: use a shorter sequence")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq, (batch_size,), generator=g)  # (B,)
    offsets = torch.arange(seq + 1)  # (T + 1,)
    windows = tokens[starts[:, None] + offsets]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]  # (B, T), (B, T)
