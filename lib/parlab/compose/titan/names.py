r"""One checkpoint format for both models: torchtitan's parameter names <-> the course's.

    single_name("layers.2.feed_forward.w1.weight", tied=True)   # "blocks.2.mlp.gate.weight"
    single_name("output.weight", tied=True)                     # "tok.weight"
    titan_names("tok.weight", tied=True)   # ["tok_embeddings.weight", "output.weight"]

Module 09's checkpoints of `parlab.compose` name every piece by the single-device
`parlab.model.Llama`'s parameter names ("blocks.2.mlp.gate.weight"), whatever the grid. The
torchtitan-style model (`parlab.compose.titan.model`) names the same tensors as torchtitan
does ("layers.2.feed_forward.w1.weight"). A checkpoint written by either loads into the other
when one side translates: torchtitan does the same with its `StateDictAdapter`, which maps
its names onto Hugging Face's (`torchtitan/models/llama3/model/state_dict_adapter.py`: one
regular expression per name, the layer number carried over).

The head. With a tied head the course's checkpoint holds one tensor, "tok.weight", and the
last pipeline stage's copy is saved under that name too (module 09, section 2); the
torchtitan-style model's `output.weight` is that copy, so it maps to "tok.weight" when tied
and to "head.weight" when not.
"""

from __future__ import annotations

import re

__all__ = ["BLOCK_NAMES", "single_name", "titan_names"]

BLOCK_NAMES = {  # inside layer i: torchtitan's -> the course's
    "attention_norm.weight": "attn_norm.weight",
    "attention.wq.weight": "attn.wq.weight",
    "attention.wk.weight": "attn.wk.weight",
    "attention.wv.weight": "attn.wv.weight",
    "attention.wo.weight": "attn.wo.weight",
    "ffn_norm.weight": "mlp_norm.weight",
    "feed_forward.w1.weight": "mlp.gate.weight",
    "feed_forward.w3.weight": "mlp.up.weight",
    "feed_forward.w2.weight": "mlp.down.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def single_name(name: str, *, tied: bool) -> str:
    """The single-device Llama's name of torchtitan-style parameter `name`."""
    if name == "tok_embeddings.weight":
        return "tok.weight"
    if name == "norm.weight":
        return "norm.weight"
    if name == "output.weight":
        return "tok.weight" if tied else "head.weight"
    found = _LAYER.match(name)
    if found and found.group(2) in BLOCK_NAMES:
        return f"blocks.{found.group(1)}.{BLOCK_NAMES[found.group(2)]}"
    raise KeyError(f"{name!r} is no parameter of the torchtitan-style Llama")


def titan_names(name: str, *, tied: bool) -> list[str]:
    """The torchtitan-style names of single-device parameter `name` (two for a tied
    embedding: the table and the head's copy)."""
    if name == "tok.weight":
        return ["tok_embeddings.weight", "output.weight"] if tied else ["tok_embeddings.weight"]
    if name == "head.weight" and not tied:
        return ["output.weight"]
    if name == "norm.weight":
        return ["norm.weight"]
    found = _BLOCK.match(name)
    inverse = {v: k for k, v in BLOCK_NAMES.items()}
    if found and found.group(2) in inverse:
        return [f"layers.{found.group(1)}.{inverse[found.group(2)]}"]
    raise KeyError(f"{name!r} is no parameter of the single-device Llama (tied={tied})")
