"""The single-device models: the references every parallel version is checked against.

- `transformer`: `attention_heads`, `Attention` (fused [Q; K; V] projection), `MLP`, `Block`
  (a pre-LayerNorm transformer layer).
- `gpt`: `GPTConfig` and `GPT`, a tiny GPT built from `Block`s (module 07's capstone).
- `llama`: `LlamaConfig` and `Llama`, a Llama-style model (RMSNorm, rotary embeddings, SwiGLU,
  grouped-query attention, tied or untied head, optional MoE layers; module 08), with its
  pieces `RMSNorm`, `rope_angles`, `apply_rope`, `expand_kv`, `swiglu`, `MoESwiGLU`,
  `sequence_keep_mask`, `LlamaBlock`.
- `corpus`: the synthetic training text shipped in `data/`, `load_corpus` and `batch`.
- `recompute`: a GPT layer with Megatron's unfused attention core and activation
  recomputation ("none", "selective", "full"), its saved bytes measured (module 08).
"""

from parlab.model.corpus import CORPUS_FILE, batch, load_corpus
from parlab.model.gpt import GPT, GPTConfig
from parlab.model.llama import (
    Llama,
    LlamaBlock,
    LlamaConfig,
    MoESwiGLU,
    RMSNorm,
    apply_rope,
    expand_kv,
    rope_angles,
    sequence_keep_mask,
    swiglu,
)
from parlab.model.recompute import (
    POLICIES,
    RecomputeLayer,
    layer_flops,
    recompute_flops,
    saved_activation_bytes,
)
from parlab.model.transformer import MLP, Attention, Block, attention_heads

__all__ = [
    "POLICIES", "RecomputeLayer", "layer_flops", "recompute_flops", "saved_activation_bytes",
    "attention_heads", "Attention", "MLP", "Block", "GPTConfig", "GPT", "load_corpus", "batch",
    "CORPUS_FILE", "LlamaConfig", "Llama", "LlamaBlock", "RMSNorm", "rope_angles", "apply_rope",
    "expand_kv", "swiglu", "MoESwiGLU", "sequence_keep_mask",
]
