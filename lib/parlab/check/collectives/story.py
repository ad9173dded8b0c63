r"""What a wrong ring all-reduce did, told from its output (module 00, exercise 1).

Inputs of the check (`make_input`): "rank" (rank r holds r everywhere: the sum is
$t(t-1)/2$); "tagged" (element i of rank r is $B^r + B^t i$ with $B = t+1$: an exact sum whose
base-B digits say which ranks reached an element, how often, and which element it came from);
"random" (standard normal, compared with rtol=1e-5, atol=1e-6: a ring adds in another order
than one process does, about 1e-7 relative in float32). `tagged_story` and `plain_story` turn
the first wrong element into a sentence and a likely mistake.
"""

from __future__ import annotations

import math

import torch

__all__ = ["INPUTS", "TAGGED_NOTE", "HINTS", "make_input", "expected_sum", "chunk_ids",
           "decode", "who", "tagged_story", "plain_story"]

INPUTS = ("rank", "tagged", "random")
TAGGED_NOTE = " (element i of rank r is (t+1)**r + (t+1)**t * i: a sum shows who reached it)"
HINTS = {
    "no_all_gather": "values are partial sums and only one chunk is complete: did you skip the "
    "all-gather phase? After the t-1 reduce-scatter steps each rank owns one finished chunk; "
    "t-1 more steps must pass the finished chunks around the ring",
    "partial": "values are partial sums: some contributions never arrived. At every step add "
    "the chunk you receive from the left into the chunk with that index; run t-1 "
    "reduce-scatter steps, then t-1 all-gather steps",
    "twice": "some ranks' values were counted more than once: in the all-gather phase copy the "
    "received chunk (chunk.copy_(buf)); only the reduce-scatter phase adds",
    "index": "a chunk index is off: check that the chunk you receive into at each step is the "
    "chunk your left neighbour sends at that step (an off-by-one in (r - s) % t?)",
    "hang": "a send or receive never met its partner. Either every rank made a blocking "
    "dist.send at once (each waits for a receiver that is itself sending: post dist.isend and "
    "dist.irecv without waiting, even ranks sending first and odd ranks receiving first, as "
    "NCCL needs with 2 ranks, then wait on both), or a rank receives from the "
    "wrong peer (receive from the left, (r - 1) % t, what the left sends to its right)",
    "no_send": "send chunks to your right neighbour with dist.isend (or dist.send) and "
    "receive from the left with dist.irecv (or dist.recv)",
    "shape": "the hidden checks use lengths that t does not divide (and fewer elements than "
    "ranks): split with torch.tensor_split(x, t), whose t chunks differ by at most one element "
    "(x.view(t, -1) needs t to divide the length; x.chunk(t) can return fewer than t chunks)",
    "in_place": "ring_allreduce(x) must return a new tensor and leave x as it was: work on "
    "out = x.clone() and its chunks (torch.tensor_split(out, t)), not on views of x",
}


def make_input(kind: str, rank: int, t: int, numel: int, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> torch.Tensor:
    """Rank `rank`'s input of one check case (see the module docstring), (numel,)."""
    if kind == "rank":
        return torch.full((numel,), float(rank), dtype=dtype)
    if kind == "tagged":
        return ((t + 1) ** rank + (t + 1) ** t * torch.arange(numel, dtype=torch.float64)).to(dtype)
    if kind == "random":
        gen = torch.Generator().manual_seed(seed * 1009 + rank)
        return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)
    raise ValueError(f"input kind must be one of {INPUTS}, got {kind!r}")


def expected_sum(kind: str, t: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """What dist.all_reduce returns for the case, computed in one process: the ranks' inputs
    summed in float64, then rounded once to `dtype` (exact for "rank" and "tagged")."""
    total = sum(make_input(kind, r, t, numel, dtype, seed).double() for r in range(t))
    return torch.as_tensor(total).to(dtype)


def chunk_ids(numel: int, t: int) -> list[int]:
    """The chunk index of every element under torch.tensor_split(x, t)."""
    sizes = [len(c) for c in torch.tensor_split(torch.empty(numel), t)]
    return [c for c, size in enumerate(sizes) for _ in range(size)]


def decode(value: float, t: int) -> tuple[list[int], int] | None:
    """A tagged sum -> (multiplicity of each rank, element index), or None if not one."""
    if not math.isfinite(value) or value < 0 or value != round(value):
        return None
    base, v = t + 1, int(round(value))
    low, rest = v % base**t, v // base**t
    counts = [(low // base**r) % base for r in range(t)]
    if sum(counts) == 0:  # nothing from any rank: only a plain 0 decodes
        return (counts, -1) if v == 0 else None
    return None if rest % sum(counts) else (counts, rest // sum(counts))


def who(counts: list[int]) -> str:
    """[1, 0, 2] -> "rank 0 once and rank 2 twice"; [0, 1, 1] -> "ranks 1, 2 only"."""
    if all(c == 1 for c in counts):
        return f"all {len(counts)} ranks"
    groups = {c: [r for r, k in enumerate(counts) if k == c] for c in sorted(set(counts)) if c}
    times = {1: "only" if list(groups) == [1] else "once", 2: "twice"}
    return " and ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} "
                        f"{times.get(c, f'{c} times')}" for c, rs in groups.items())


def tagged_story(got: torch.Tensor, ref: torch.Tensor, t: int) -> tuple[str, str] | None:
    """(what the first wrong element holds, a likely-mistake hint) for one rank's tagged case."""
    numel, chunk = ref.numel(), chunk_ids(ref.numel(), t)
    wrong = [j for j in range(numel) if float(got[j]) != float(ref[j])]
    if not wrong:
        return None
    decoded = {k: decode(float(got[k]), t) for k in wrong}
    j, d = wrong[0], decoded[wrong[0]]
    src = "" if d is None else "the same element" if d[1] == j else f"element {d[1]}"
    what = ("which mixes values of different elements" if d is None else
            "which is 0: nothing was written there" if d[1] < 0 else
            f"which is {src} summed over {who(d[0])}")
    partial = all(x is not None and x[1] == k and max(x[0]) <= 1 for k, x in decoded.items())
    if partial and len(set(chunk) - {chunk[k] for k in wrong}) == 1:  # one complete chunk
        hint = HINTS["no_all_gather"]
    elif partial:
        hint = HINTS["partial"]
    else:
        hint = HINTS["twice" if any(x and max(x[0]) > 1 for x in decoded.values()) else "index"]
    return (f"element {j} (chunk {chunk[j]} of {t}) holds {float(got[j]):.0f}, {what}; expected "
            f"{float(ref[j]):.0f} (element {j} summed over all {t} ranks)"), hint


def plain_story(got: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor, t: int,
                kind: str) -> tuple[str, str]:
    """(first wrong element, expected vs got; a hint) for the rank and random inputs."""
    j = int(torch.nonzero(bad)[0])
    text = (f"element {j} (chunk {chunk_ids(ref.numel(), t)[j]} of {t}): expected "
            f"{float(ref[j]):.6g}, got {float(got[j]):.6g} ({int(bad.sum())} of {bad.numel()} "
            "elements wrong)") + (f"; all should be t(t-1)/2 = {t * (t - 1) // 2}"
                                  if kind == "rank" else "")
    ratio = float(got[j]) / float(ref[j]) if float(ref[j]) else float("nan")
    if math.isfinite(ratio) and ratio > 1.5 and abs(ratio - round(ratio)) < 1e-4:
        return text, (f"values are {round(ratio)} times too large: in the all-gather phase copy "
                      "the received chunk instead of adding it")
    return text, ("check the chunk indices of both phases, and that the reduce-scatter adds "
                  "the received chunk while the all-gather copies it")
