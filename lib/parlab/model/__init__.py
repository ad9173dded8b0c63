"""The single-device models: the references every parallel version is checked against.

- `transformer`: `attention_heads`, `Attention` (fused [Q; K; V] projection), `MLP`, `Block`
  (a pre-LayerNorm transformer layer).
- `gpt`: `GPTConfig` and `GPT`, a tiny GPT built from `Block`s (module 07's capstone).
- `corpus`: the synthetic training text shipped in `data/`, `load_corpus` and `batch`.
"""

from parlab.model.corpus import CORPUS_FILE, batch, load_corpus
from parlab.model.gpt import GPT, GPTConfig
from parlab.model.transformer import MLP, Attention, Block, attention_heads

__all__ = [
    "attention_heads", "Attention", "MLP", "Block", "GPTConfig", "GPT", "load_corpus", "batch",
    "CORPUS_FILE",
]
