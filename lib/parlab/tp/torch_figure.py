"""The collectives of one step, yours beside PyTorch's, drawn part by part (modules 02 and 03).

`plot_step_collectives(sides)`: for each part of the model (the embedding, each block's
attention and MLP, the head, the loss) one row per side, in two panels, forward and backward;
each collective a segment as long as the bytes one rank sends for it (ring), coloured by its
kind and hatched by side, the row's total written at its end. Two sides that do the same
thing draw the same rows; a collective one of them makes twice stands out as a longer row.

`calls_table(sides)`: the same as a Markdown table, bytes per part, pass and side, with the
all-reduces made after backward to read the gradients of replicated parameters (SP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from parlab.tp.torch_measure import Call

__all__ = ["plot_step_collectives", "calls_table", "KIND_COLOURS"]

KIND_COLOURS = {"all_reduce": "#4c72b0", "all_gather": "#55a868", "reduce_scatter": "#dd8452",
                "all_to_all_single": "#8172b3", "broadcast": "#937860"}
HATCHES = ("", "//", "..")  # one per side, in the order given
PHASES = ("forward", "backward", "after")  # "after": reading the gradients (SP)


def _parts(sides: Mapping[str, Sequence[Call]], phase: str) -> list[str]:
    """The parts that communicate in `phase`, in the order the first side made them."""
    seen: dict[str, None] = {}
    for calls in sides.values():
        for c in calls:
            if c.phase == phase:
                seen.setdefault(c.region, None)
    return list(seen)


def plot_step_collectives(sides: Mapping[str, Sequence[Call]], *, title: str = "") -> Figure:
    """Both passes' collectives, part by part, one bar per side (module docstring)."""
    names = list(sides)
    rows = {phase: [(part, name) for part in _parts(sides, phase) for name in names]
            for phase in PHASES[:2]}
    height = max(len(r) for r in rows.values())
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * height + 1.8), sharex=True)
    top = max((sum(c.wire for c in calls if c.phase == p and c.region == part)
               for calls in sides.values() for p in PHASES[:2] for part, _ in rows[p]),
              default=1)
    for ax, phase in zip(axes, PHASES[:2], strict=True):
        for y, (part, name) in enumerate(rows[phase]):
            left = 0.0
            for c in (c for c in sides[name] if c.phase == phase and c.region == part):
                ax.barh(y, c.wire, left=left, color=KIND_COLOURS.get(c.kind, "grey"),
                        edgecolor="white", height=0.7, hatch=HATCHES[names.index(name) % 3])
                left += c.wire
            ax.text(left + top * 0.02, y, f"{left:,.0f} B", va="center", fontsize=8)
        ax.set_yticks(range(len(rows[phase])))
        ax.set_yticklabels([part if name == names[0] else "" for part, name in rows[phase]],
                           fontsize=8)  # one label per part; the hatch says whose row it is
        ax.invert_yaxis()
        ax.set_xlim(0, top * 1.35)
        ax.set_title(f"{phase}", fontsize=10)
        ax.set_xlabel("bytes one rank sends (ring)")
    kinds = sorted({c.kind for calls in sides.values() for c in calls if c.phase in PHASES[:2]})
    fig.legend(handles=[Patch(color=KIND_COLOURS.get(k, "grey"), label=k) for k in kinds]
               + [Patch(facecolor="white", edgecolor="black", hatch=HATCHES[i % 3], label=n)
                  for i, n in enumerate(names)],
               loc="lower center", ncol=len(kinds) + len(names), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def calls_table(sides: Mapping[str, Sequence[Call]]) -> str:
    """| part | pass | side: its collectives and bytes |, one row per part and pass."""
    names = list(sides)
    lines = ["| part | pass | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for phase in PHASES:
        for part in _parts(sides, phase):
            cells = []
            for name in names:
                calls = [c for c in sides[name] if c.phase == phase and c.region == part]
                kinds = [c.kind for c in calls]
                named = ", ".join(f"{kinds.count(k)} × {k}" if kinds.count(k) > 1 else k
                                  for k in dict.fromkeys(kinds))
                cells.append(f"{named}: {sum(c.wire for c in calls):,.0f} B" if calls
                             else "none")
            lines.append(f"| {part} | {phase} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(c.wire for c in sides[n]):,.0f} B**" for n in names]
    lines.append("| **the step** | | " + " | ".join(totals) + " |")
    return "\n".join(lines)
