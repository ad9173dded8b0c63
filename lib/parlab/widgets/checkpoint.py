r"""Module 09's pictures of a distributed checkpoint: which piece of which tensor is in which file.

    pieces = checkpoint_pieces("ckpt/iter_0000002")     # every saved piece, from .metadata
    print(describe_checkpoint(pieces))                   # one row per file: bytes, pieces
    plot_checkpoint(pieces, ["model.blocks.0.attn.wq.weight", ...])   # one panel per tensor

Everything is read from the checkpoint's own `.metadata` (what `torch.distributed.checkpoint`
writes on rank 0: each piece's offsets and sizes in its whole tensor, and the file and byte
range that hold it), never from the run that wrote it. Rank r writes `__r_0.distcp`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import torch.distributed.checkpoint as dcp
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

__all__ = ["Piece", "checkpoint_pieces", "describe_checkpoint", "plot_checkpoint"]


@dataclass(frozen=True)
class Piece:
    """One saved piece of one tensor (or one saved object: shape ())."""

    key: str
    shape: tuple[int, ...]
    """The whole tensor's shape."""
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    nbytes: int
    """Bytes of the piece in its file."""

    @property
    def rank(self) -> int:
        """The rank that wrote it (files are named __<rank>_<n>.distcp)."""
        found = re.match(r"__(\d+)_", self.file)
        return int(found[1]) if found else -1


def checkpoint_pieces(path: str | Path) -> list[Piece]:
    """Every piece of the DCP checkpoint at `path`, as its metadata lists them."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    where = {(i.fqn, tuple(i.offset) if i.offset is not None else ()): s
             for i, s in md.storage_data.items()}
    out = []
    for key, meta in md.state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            for chunk in meta.chunks:
                info = where[(key, tuple(chunk.offsets))]
                out.append(Piece(key, tuple(meta.size), tuple(chunk.offsets),
                                 tuple(chunk.sizes), info.relative_path, info.length))
        else:
            info = next(s for (k, _), s in where.items() if k == key)
            out.append(Piece(key, (), (), (), info.relative_path, info.length))
    return sorted(out, key=lambda p: (p.key, p.offsets))


def describe_checkpoint(pieces: list[Piece]) -> str:
    """A markdown table: each file, the bytes it holds, and its pieces by kind."""
    files: dict[str, list[Piece]] = defaultdict(list)
    for p in pieces:
        files[p.file].append(p)
    lines = ["| file | written by | bytes | model pieces | optimizer pieces | other |",
             "|---|---|---|---|---|---|"]
    for name in sorted(files, key=lambda f: (Piece("", (), (), (), f, 0).rank, f)):
        held = files[name]
        kinds = [sum(p.key.startswith(k) for p in held) for k in ("model.", "optim.")]
        other = ", ".join(sorted({p.key for p in held if not p.key.startswith(("model.",
                                                                               "optim."))}))
        lines.append(f"| `{name}` | rank {held[0].rank} | {sum(p.nbytes for p in held):,} | "
                     f"{kinds[0]} | {kinds[1]} | {other or '-'} |")
    return "\n".join(lines)


def _rect(shape: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[
        float, float, float, float]:
    """(x, y, w, h) of a piece in a drawing of the tensor as rows × columns (dim 0 down; a
    1-D tensor is one row; dims after the second are folded into the columns)."""
    if len(shape) == 1:
        return offsets[0], 0, sizes[0], 1
    inner = 1
    for n in shape[2:]:
        inner *= n
    return offsets[1] * inner, offsets[0], sizes[1] * inner, sizes[0]


def plot_checkpoint(pieces: list[Piece], keys: list[str], *, columns: int = 2) -> Figure:
    """One panel per key: the whole tensor, each saved piece a box coloured by the rank that
    wrote it and labelled with it."""
    ranks = sorted({p.rank for p in pieces})
    colours = {r: plt.get_cmap("tab10")(i % 10) for i, r in enumerate(ranks)}
    rows = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 2.9 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        mine = [p for p in pieces if p.key == key]
        if not mine:
            raise ValueError(f"{key!r} is not in this checkpoint")
        shape = mine[0].shape
        width, height = _rect(shape, (0,) * len(shape), shape)[2:]
        for p in mine:
            x, y, w, h = _rect(shape, p.offsets, p.sizes)
            ax.add_patch(Rectangle((x, y), w, h, facecolor=colours[p.rank], edgecolor="black",
                                   alpha=0.8))
            ax.text(x + w / 2, y + h / 2, f"rank {p.rank}", ha="center", va="center",
                    fontsize=8)
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        ax.set_title(f"{key}\nwhole {tuple(shape)}, {len(mine)} pieces", fontsize=9)
        ax.set_xlabel("dim 1" + (" (dims 1.. folded)" if len(shape) > 2 else "")
                      if len(shape) > 1 else "dim 0")
        ax.set_ylabel("dim 0" if len(shape) > 1 else "")
        if len(shape) == 1:
            ax.set_yticks([])
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle("Which rank's file holds which piece of each tensor", fontsize=10)
    fig.tight_layout()
    return fig
