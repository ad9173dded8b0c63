r"""Graded checks of module 00. Exercise 1, `check_ring_allreduce`: the learner's
`ring_allreduce(x)` runs on every rank and must equal `dist.all_reduce`; the tracer must show
only point-to-point calls, each rank sending $2\frac{t-1}{t}n$ bytes (a ring; $2(t-1)n$ over all
ranks when t does not divide the length). Inputs: "rank" (rank r holds r: the sum is t(t-1)/2);
"tagged" (element i of rank r is $B^r + B^t i$, $B = t+1$: exact sums whose base-B digits tell
which ranks, how often, and which element reached a value, explaining a wrong one); "random"
(rtol=1e-5, atol=1e-6: the ring adds in another order than gloo, ~1e-7 relative in float32).
Exercise 2, `check_intensities` and `check_placement`: FLOPs per byte against `parlab.costs`
(relative tolerance 1e-6, so float32 is fine) at seed 000's numbers and at random points.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from parlab import costs
from parlab.check import CHECK_TIMEOUT_S, CheckFailed, fail, not_reexport, ranks
from parlab.launch import CollectiveTimeout

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
    "deadlock": "every rank waits for a peer that is waiting too. A blocking dist.send on "
    "every rank at once never completes (it waits for the receiver to post its recv): post "
    "dist.irecv and dist.isend, then wait on both, or let even ranks send first",
    "no_send": "send chunks to your right neighbour with dist.isend or dist.send, called "
    "as dist.isend(...) (the tracer does not see `from torch.distributed import isend`)",
}
_SENDS = ("send", "isend")
_P2P = (*_SENDS, "recv", "irecv")
_EXACT_LIMIT = {torch.float16: 2**11, torch.bfloat16: 2**8, torch.float32: 2**24}


# --- exercise 1: ring all-reduce --------------------------------------------------------------

def make_input(kind: str, rank: int, t: int, numel: int, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> torch.Tensor:
    """Rank `rank`'s input of one check case (see the module docstring)."""
    if kind == "rank":
        return torch.full((numel,), float(rank), dtype=dtype)
    if kind == "tagged":
        return ((t + 1) ** rank + (t + 1) ** t * torch.arange(numel, dtype=torch.float64)).to(dtype)
    if kind == "random":
        gen = torch.Generator().manual_seed(seed * 1009 + rank)
        return torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)
    raise ValueError(f"input kind must be one of {INPUTS}, got {kind!r}")


def _ring_worker(fn: Callable, numel: int, dtype: torch.dtype, cases: tuple, seed: int) -> list:
    """Runs on every rank: reference all-reduces first, then the learner's function, traced."""
    import torch.distributed as dist

    from parlab import comm

    rank, t = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")  # NCCL ranks own one GPU each
    inputs = [make_input(c, rank, t, numel, dtype, seed).to(dev) for c in cases]
    refs = [x.clone() for x in inputs]
    for ref in refs:
        dist.all_reduce(ref)
    out = []
    for case, x, ref in zip(cases, inputs, refs, strict=True):
        with comm.trace() as tr:
            got = fn(x.clone())
        got = got.detach().cpu().clone() if isinstance(got, torch.Tensor) else got
        out.append({"case": case, "got": got, "ref": ref.cpu(), "events": list(tr.events)})
    return out


def _chunk_ids(numel: int, t: int) -> list[int]:
    """The chunk index of every element under torch.tensor_split(x, t)."""
    sizes = [len(c) for c in torch.tensor_split(torch.empty(numel), t)]
    return [c for c, size in enumerate(sizes) for _ in range(size)]


def _decode(value: float, t: int) -> tuple[list[int], int] | None:
    """A tagged sum -> (multiplicity of each rank, element index), or None if not one."""
    if not math.isfinite(value) or value < 0 or value != round(value):
        return None
    base, v = t + 1, int(round(value))
    low, rest = v % base**t, v // base**t
    counts = [(low // base**r) % base for r in range(t)]
    if sum(counts) == 0:  # nothing from any rank: only a plain 0 decodes
        return (counts, -1) if v == 0 else None
    return None if rest % sum(counts) else (counts, rest // sum(counts))


def _who(counts: list[int]) -> str:
    """[1, 0, 2] -> "rank 0 once and rank 2 twice"; [0, 1, 1] -> "ranks 1, 2 only"."""
    if all(c == 1 for c in counts):
        return f"all {len(counts)} ranks"
    groups = {c: [r for r, k in enumerate(counts) if k == c] for c in sorted(set(counts)) if c}
    times = {1: "only" if list(groups) == [1] else "once", 2: "twice"}
    return " and ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} "
                        f"{times.get(c, f'{c} times')}" for c, rs in groups.items())


def _tagged_story(got: torch.Tensor, ref: torch.Tensor, t: int) -> tuple[str, str] | None:
    """(what the first wrong element holds, a likely-mistake hint) for one rank's tagged case."""
    numel, chunk = ref.numel(), _chunk_ids(ref.numel(), t)
    wrong = [j for j in range(numel) if float(got[j]) != float(ref[j])]
    if not wrong:
        return None
    decoded = {k: _decode(float(got[k]), t) for k in wrong}
    j, d = wrong[0], decoded[wrong[0]]
    src = "" if d is None else "the same element" if d[1] == j else f"element {d[1]}"
    what = ("which mixes values of different elements" if d is None else
            "which is 0: nothing was written there" if d[1] < 0 else
            f"which is {src} summed over {_who(d[0])}")
    partial = all(x is not None and x[1] == k and max(x[0]) <= 1 for k, x in decoded.items())
    if partial and len(set(chunk) - {chunk[k] for k in wrong}) == 1:  # one complete chunk
        hint = HINTS["no_all_gather"]
    elif partial:
        hint = HINTS["partial"]
    else:
        hint = HINTS["twice" if any(x and max(x[0]) > 1 for x in decoded.values()) else "index"]
    return (f"element {j} (chunk {chunk[j]} of {t}) holds {float(got[j]):.0f}, {what}; expected "
            f"{float(ref[j]):.0f} (element {j} summed over all {t} ranks)"), hint


def _sent(events: Sequence[Any]) -> float:  # bytes this rank put on the wire
    return sum(e.wire_bytes for e in events if e.kind in _SENDS)


def _check_protocol(results: list, t: int) -> None:
    for rank, cases in enumerate(results):
        for case in cases:
            banned = [e.kind for e in case["events"] if e.kind not in _P2P]
            if banned:
                fail(f"ring_allreduce called {', '.join(dict.fromkeys(banned))}", rank=rank,
                     hint=f"you called {banned[0]}: build the all-reduce from send/recv (or "
                     "isend/irecv) only; the exercise is to do its work yourself")
            if t > 1 and not any(e.kind in _SENDS for e in case["events"]):
                fail("ring_allreduce sent nothing", rank=rank, hint=HINTS["no_send"])


def _plain_story(got: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor, t: int,
                 kind: str) -> tuple[str, str]:
    """(first wrong element, expected vs got; a hint) for the rank and random inputs."""
    j = int(torch.nonzero(bad)[0])
    text = (f"element {j} (chunk {_chunk_ids(ref.numel(), t)[j]} of {t}): expected "
            f"{float(ref[j]):.6g}, got {float(got[j]):.6g} ({int(bad.sum())} of {bad.numel()} "
            "elements wrong)") + (f"; all should be t(t-1)/2 = {t * (t - 1) // 2}"
                                  if kind == "rank" else "")
    ratio = float(got[j]) / float(ref[j]) if float(ref[j]) else float("nan")
    if math.isfinite(ratio) and ratio > 1.5 and abs(ratio - round(ratio)) < 1e-4:
        return text, (f"values are {round(ratio)} times too large: in the all-gather phase copy "
                      "the received chunk instead of adding it")
    return text, ("check the chunk indices of both phases, and that the reduce-scatter adds "
                  "the received chunk while the all-gather copies it")


def _check_values(results: list, t: int, dtype: torch.dtype, bytes_note: str) -> None:
    for rank, cases in enumerate(results):
        for case in sorted(cases, key=lambda c: c["case"] != "tagged"):  # tagged explains best
            got, ref, kind = case["got"], case["ref"], case["case"]
            where = f"input {kind!r}" + (TAGGED_NOTE if kind == "tagged" else "")
            if not isinstance(got, torch.Tensor):
                fail(f"{where}: ring_allreduce returned {type(got).__name__}, not a tensor",
                     rank=rank, hint="return the all-reduced tensor (same shape as x)")
            if got.shape != ref.shape:
                one = got.numel() in {len(c) for c in torch.tensor_split(ref, t)}
                fail(f"{where}: got shape {tuple(got.shape)}, expected {tuple(ref.shape)}",
                     rank=rank, hint="return the whole all-reduced tensor, not one chunk" + (
                         " (yours is one chunk long: the all-gather phase is missing?)"
                         if one else ""))
            if got.dtype != dtype:
                fail(f"{where}: got dtype {got.dtype} for a {dtype} input", rank=rank,
                     hint="keep x's dtype: make buffers with torch.empty_like(chunk)")
            bad = ~torch.isclose(got.double(), ref.double(), rtol=1e-5, atol=1e-6)
            if bool(bad.any()):
                story = (_tagged_story(got, ref, t) if kind == "tagged" else None) or \
                    _plain_story(got, ref, bad, t, kind)
                fail(f"{where}: {story[0]}" + bytes_note, rank=rank, hint=story[1])


def _check_bytes(results: list, t: int, numel: int, dtype: torch.dtype) -> str:
    """'' when every rank sent what a ring sends; otherwise a sentence saying how not."""
    es = torch.empty((), dtype=dtype).element_size()
    n = numel * es
    sent = [_sent(cases[0]["events"]) for cases in results]
    if numel % t == 0:
        want = costs.ring_allreduce_bytes(n, t)
        for rank, s in enumerate(sent):
            if s != want:
                why = ("are you sending whole tensors instead of 1/t chunks?" if s > want else
                       "did you skip the all-gather phase?" if s == want / 2 else
                       "a ring makes 2(t-1) sends of one n/t chunk each")
                return (f"\nrank {rank} sent {s:,.0f} B but a ring all-reduce sends "
                        f"2(t-1)/t*n = 2*{t - 1}/{t}*{n:,} = {want:,.0f} B per rank: {why}")
        return ""
    total, most = 2 * (t - 1) * n, 2 * (t - 1) * math.ceil(numel / t) * es
    if sum(sent) == total and max(sent) <= most:
        return ""
    return (f"\nthe ranks sent {', '.join(f'{s:,.0f}' for s in sent)} B but a ring sends "
            f"2(t-1)*n = {total:,} B in all, at most {most:,} B per rank (one chunk per step)")


def check_ring_allreduce(fn: Callable[[torch.Tensor], torch.Tensor], *, world_size: int = 2,
                         numel: int = 1024, dtype: torch.dtype = torch.float32,
                         inputs: Sequence[str] = INPUTS, seed: int = 0,
                         timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Run `fn` on `world_size` ranks and compare it with dist.all_reduce; raise CheckFailed."""
    not_reexport(fn, name="ring_allreduce")
    t = world_size
    exact = 2 * t * (t + 1) ** t * numel < _EXACT_LIMIT.get(dtype, 2**53)  # room for 2x sums
    cases = tuple(c for c in inputs if c != "tagged" or exact)
    try:
        results = ranks(_ring_worker, t, fn, numel, dtype, cases, seed, timeout=timeout)
    except CollectiveTimeout as exc:
        raise CheckFailed(f"ring_allreduce did not finish on {t} ranks within {timeout:g} s."
                          f"\n{exc}\nLikely mistake: {HINTS['deadlock']}") from None
    _check_protocol(results, t)
    bytes_note = _check_bytes(results, t, numel, dtype)
    _check_values(results, t, dtype, bytes_note)
    if bytes_note:
        fail(bytes_note.strip(), hint="send one chunk (torch.tensor_split(x, t)[i]) per step")
    if not quiet:
        print(f"ring_allreduce OK on {t} ranks: {numel} x {str(dtype).replace('torch.', '')}, "
              f"inputs {', '.join(cases)}; only send/recv calls; rank 0 sent "
              f"{_sent(results[0][0]['events']):,.0f} B")


# --- exercise 2: FLOPs per byte and placement -------------------------------------------------

SEED_POINT = {"h": 8192, "n_tokens": 4e6, "flops_per_s": costs.H100_BF16_FLOPS}
SEED_LINKS = (costs.NVLINK_BIDIR_BYTES_PER_S, costs.NVLINK_PER_DIRECTION_BYTES_PER_S,
              costs.NIC_400G_BYTES_PER_S)


def _points(random_points: int, seed: int) -> list[dict]:
    """The seed's numbers on each of its links, then random points (log-uniform)."""
    rng = random.Random(seed)
    return [dict(SEED_POINT, bytes_per_s=b) for b in SEED_LINKS] + [
        {"h": 2 ** rng.randint(9, 17), "n_tokens": round(10 ** rng.uniform(3, 8)),
         "flops_per_s": 10 ** rng.uniform(12, 16), "bytes_per_s": 10 ** rng.uniform(9, 12)}
        for _ in range(random_points)]


def _number(got: Any, want: float, call: str, hints: dict[float, str]) -> None:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"{call} returned {type(got).__name__}, expected a number ({want:.6g})",
             hint="return a plain float")
    got = float(got)
    if math.isclose(got, want, rel_tol=1e-6):
        return
    ratio = got / want if want else float("nan")
    hint = next((h for r, h in hints.items() if math.isclose(ratio, r, rel_tol=1e-6)), None)
    fail(f"{call} = {got:.9g}, expected {want:.9g} (ratio got/expected = {ratio:.4g})",
         hint=hint)


def check_intensities(tp_intensity: Callable, dp_intensity: Callable,
                      link_requirement: Callable, *, random_points: int = 0,
                      seed: int = 0, quiet: bool = False) -> None:
    """tp_intensity(h) ~ H, dp_intensity(n_tokens) = 3 N_tok, link_requirement = FLOP/s / B/s."""
    for fn in (tp_intensity, dp_intensity, link_requirement):
        not_reexport(fn, name=getattr(fn, "__name__", "your function"))
    for p in _points(random_points, seed):
        h, n, f, b = p["h"], p["n_tokens"], p["flops_per_s"], p["bytes_per_s"]
        _number(tp_intensity(h), costs.tp_flops_per_byte(h), f"tp_intensity({h})", {
            float(h): "that is the FLOPs alone (~H^2 per token): divide by the bytes moved, "
                      "BSH^2 / BSH = H", 1 / h: "inverted: FLOPs per byte is FLOPs / bytes",
            **dict.fromkeys((2.0, 0.5), "the seed drops constant factors: the ratio is H")})
        _number(dp_intensity(n), costs.dp_flops_per_byte(n), f"dp_intensity({n:g})", {
            **dict.fromkeys((2.0, 0.5, 1 / 3, 2 / 3), "6*P*N_tok FLOPs over an all-reduce "
                            "counted as 2P bytes: 6PN_tok / 2P = 3*N_tok")})
        req = costs.required_flops_per_byte(f, b)
        _number(link_requirement(f, b), req, f"link_requirement({f:.4g}, {b:.4g})", {
            1 / req**2: "inverted: a link needs FLOP/s / (bytes/s) FLOPs per byte",
            **dict.fromkeys((1e9, 1e-9), "off by 1e9: the arguments are in FLOP/s and bytes/s"),
            **dict.fromkeys((2.0, 0.5), "use bytes_per_s as given, whichever link it is")})
    if not quiet:
        print(f"intensities OK at {len(_points(random_points, seed))} points")


def check_placement(placement: Callable, *, random_points: int = 0, seed: int = 0,
                    quiet: bool = False) -> None:
    """placement(h, n_tokens, flops_per_s, bytes_per_s) -> {"tp"|"dp": {"compute_bound",
    "headroom"}} with headroom = intensity / requirement, compute-bound when >= 1."""
    not_reexport(placement, name="placement")
    for p in _points(random_points, seed):
        call = ("placement(h={h}, n_tokens={n_tokens:g}, flops_per_s={flops_per_s:.4g}, "
                "bytes_per_s={bytes_per_s:.4g})").format(**p)
        out = placement(**p)
        if not isinstance(out, dict) or set(out) != {"tp", "dp"} or not all(
                isinstance(v, dict) and {"compute_bound", "headroom"} <= set(v)
                for v in out.values()):
            fail(f"{call} returned {out!r:.200}", hint='return a dict shaped like {"tp": '
                 '{"compute_bound": bool, "headroom": float}, "dp": {...the same...}}')
        for key, offered in (("tp", costs.tp_flops_per_byte(p["h"])),
                             ("dp", costs.dp_flops_per_byte(p["n_tokens"]))):
            want = costs.headroom(offered, p["flops_per_s"], p["bytes_per_s"])
            _number(out[key]["headroom"], want, f'{call}["{key}"]["headroom"]', {
                1 / want**2: "inverted: headroom = what the strategy offers / what the link "
                             "needs (intensity / link requirement); above 1 is compute-bound"})
            bound = out[key]["compute_bound"]
            if type(bound).__name__ not in ("bool", "bool_") or bool(bound) != (want >= 1):
                fail(f'{call}["{key}"]["compute_bound"] = {bound!r} ({type(bound).__name__}), '
                     f"expected {want >= 1} (headroom {want:.3g})", hint="a bool, True when "
                     "headroom >= 1: the strategy does at least the FLOPs per byte the link needs")
    if not quiet:
        print(f"placement OK at {len(_points(random_points, seed))} points")
