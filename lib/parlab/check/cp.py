r"""Graded checks of module 05, context parallelism (helpers in `parlab.check.cp_common`).

Exercise 1, `check_merge(merge)`: partial results of `parlab.cp.block_attention` over disjoint
key blocks, merged by the learner, against float64 softmax attention over all the keys:
float64 cases to 1e-10 (blocking only reorders sums), including a fully masked block (lse
-inf) first, second and on both sides, and four blocks folded from the empty partial (0, -inf);
float32 cases against the float64 reference to rtol 1e-5 (scores near 1) and 1e-4 (scores
up to ~200, where float32's exp would overflow without the max shift).

Exercise 2, `check_ring_forward(fn)`: `fn(q, k, v, pos, causal=...)` -> (out, lse) on every
rank, for contiguous, striped and zigzag positions, non-causal then causal (float64, 1e-10),
then causal with large logits in float32; only isend/irecv (or send/recv) with neighbours;
and the overlap: every block but the last must be computed while a receive is in flight.
Exercises 3 and 4 are in `parlab.check.cp_grads` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, assert_close, fail, not_reexport
from parlab.check.cp_common import (
    BF16,
    F32_TOL,
    F64_TOL,
    LARGE_TOL,
    MASK,
    NO_BLOCKS,
    OVERLAP,
    SEED,
    WEIGHTS,
    N,
    Recorder,
    call,
    check_protocol,
    cpu,
    env,
    inputs,
    lse_story,
    reference,
    run_ranks,
)
from parlab.check.cp_grads import check_layouts, check_ring_backward
from parlab.cp import blocks, ring
from parlab.cp.blocks import block_attention, empty_partial, merge_partials
from parlab.cp.layout import LAYOUTS, position_table
from parlab.errors import reference_message, refused

__all__ = ["check_merge", "check_ring_forward", "check_ring_backward", "check_layouts",
           "CheckFailed"]
REFERENCE_RING = (ring.ring_attention_forward, ring.ring_attention_backward)
RING_REFUSED = reference_message("parlab.cp.ring_attention_forward / backward")


# --- exercise 1: merge ---------------------------------------------------------------------------

def _merge_cases() -> list[dict]:
    """(name, q_pos, key blocks, causal, dtype, scale, tolerance, start empty?)."""
    ar = torch.arange
    striped = [ar(r, 16, 4) for r in range(4)]
    return [
        {"name": "two key blocks, float64", "q": ar(0, 5), "blocks": [ar(0, 5), ar(5, 12)],
         "causal": False, "dtype": torch.float64, "scale": 1.0, "tol": F64_TOL},
        {"name": "causal, the second block fully masked (lse -inf), float64", "q": ar(0, 6),
         "blocks": [ar(0, 6), ar(6, 12)], "causal": True, "dtype": torch.float64,
         "scale": 1.0, "tol": F64_TOL},
        {"name": "causal, the first block fully masked, float64", "q": ar(0, 6),
         "blocks": [ar(6, 12), ar(0, 6)], "causal": True, "dtype": torch.float64,
         "scale": 1.0, "tol": F64_TOL},
        {"name": "causal, both blocks fully masked (expect out 0, lse -inf), float64",
         "q": ar(0, 3), "blocks": [ar(3, 6), ar(6, 9)], "causal": True,
         "dtype": torch.float64, "scale": 1.0, "tol": F64_TOL},
        {"name": "causal, four striped blocks folded from the empty partial (0, -inf), float64",
         "q": ar(1, 16, 4), "blocks": striped, "causal": True, "dtype": torch.float64,
         "scale": 1.0, "tol": F64_TOL, "empty": True},
        {"name": "three blocks, float32", "q": ar(0, 6), "blocks": [ar(0, 4), ar(4, 9),
                                                                  ar(9, 16)],
         "causal": False, "dtype": torch.float32, "scale": 1.0, "tol": F32_TOL},
        {"name": "float32 with large scores (lse up to ~200)", "q": ar(0, 6),
         "blocks": [ar(0, 8), ar(8, 16)], "causal": False, "dtype": torch.float32,
         "scale": 60.0, "tol": LARGE_TOL},
    ]


def _merge_case(merge: Callable, case: dict, seed: int) -> None:
    q_pos, blocks = case["q"], case["blocks"]
    seq = int(max(int(b.max()) for b in blocks)) + 1
    q_all, k, v = inputs(seed, max(seq, int(q_pos.max()) + 1), case["dtype"], case["scale"])
    q = q_all[..., q_pos, :]  # (B, H, nq, D)
    parts = [block_attention(q, k[..., b, :], v[..., b, :], q_pos, b, causal=case["causal"])
             for b in blocks]
    keys = torch.cat(blocks)
    want_out, want_lse = reference(q, k[..., keys, :], v[..., keys, :], q_pos, keys,
                                   case["causal"])
    got = empty_partial(q) if case.get("empty") else parts[0]
    for part in parts[0 if case.get("empty") else 1:]:
        got = call(f"merge ({case['name']})", merge, got[0], got[1], *part)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(x, Tensor)
                                                                  for x in got)):
            fail(f"{case['name']}: merge returned {type(got).__name__}, expected a tuple "
                 "(out, lse) of tensors", hint="return out, lse")
    out, lse = got
    where = f"{case['name']}"
    for name, x, want in (("out", out, want_out), ("lse", lse, want_lse)):
        if x.shape != want.shape:
            fail(f"{where}: {name} has shape {tuple(x.shape)}, expected {tuple(want.shape)}",
                 hint="out is (B, H, n, D) and lse (B, H, n), the shapes of the inputs")
    story = lse_story(out, lse, want_lse, [p[1] for p in parts])
    assert_close(lse, want_lse, name=f"{where}: the merged lse", hint=story or WEIGHTS,
                 **case["tol"])
    assert_close(out, want_out, name=f"{where}: the merged out", hint=story or WEIGHTS,
                 **case["tol"])
    if out.dtype != parts[0][0].dtype or lse.dtype != parts[0][1].dtype:
        fail(f"{where}: merge returned out {out.dtype} and lse {lse.dtype} for "
             f"{parts[0][0].dtype} partials", hint="return out and lse in the dtype of out_a "
             "and lse_a: " + (BF16 if torch.bfloat16 in (out.dtype, lse.dtype) else
                              "do not cast them"))


def check_merge(merge: Callable, *, seed: int = SEED, quiet: bool = False) -> None:
    """merge(out_a, lse_a, out_b, lse_b) -> (out, lse): see the module docstring."""
    not_reexport(merge, name="merge")
    with refused([blocks.merge_partials], reference_message("parlab.cp.merge_partials")):
        for i, case in enumerate(_merge_cases()):
            _merge_case(merge, case, seed + i)
    if not quiet:
        print(f"merge OK: {len(_merge_cases())} cases against softmax attention over all the "
              "keys, fully masked blocks included; float64 to 1e-10, float32 to 1e-5 (1e-4 with "
              "scores up to ~200)")


# --- exercise 2: the ring forward ---------------------------------------------------------------

def _cases(world: int) -> list[dict]:
    seq = world * N
    cases = [{"layout": lay, "causal": c, "dtype": torch.float64, "scale": 1.0, "tol": F64_TOL}
             for c in (False, True) for lay in LAYOUTS]
    cases.append({"layout": "contiguous", "causal": True, "dtype": torch.float32,
                  "scale": 60.0, "tol": LARGE_TOL})
    for i, case in enumerate(cases):
        case["table"] = position_table(case["layout"], world, seq)
        case["name"] = (f"{case['layout']} layout, {'causal' if case['causal'] else 'not causal'}"
                        f", {str(case['dtype']).replace('torch.', '')}"
                        + (" with large scores (lse up to ~200)" if case["scale"] > 1 else ""))
        case["seed"] = SEED + i
    return cases


def _forward_worker(fn: Callable, cases: list[dict]) -> list[dict]:
    rank, world, dev = env()
    results = []
    for case in cases:
        q, k, v = inputs(case["seed"], world * N, case["dtype"], case["scale"])
        mine = case["table"][rank]
        args = [x[..., mine, :].contiguous().to(dev) for x in (q, k, v)]
        with refused(REFERENCE_RING, RING_REFUSED), Recorder() as rec:
            got = call("ring_attention", fn, *args, case["table"], causal=case["causal"])
        if not (isinstance(got, tuple) and len(got) == 2):
            fail(f"{case['name']}: ring_attention returned {type(got).__name__}, expected a "
                 "tuple (out, lse)", rank=rank, hint="return out, lse")
        results.append({"out": cpu(got[0]), "lse": cpu(got[1]), "events": rec.events})
    return results


def _wrong_mask(q: Tensor, k: Tensor, v: Tensor, table: Tensor, rank: int) -> dict[str, Tensor]:
    """This rank's output under the likely wrong masks (for the message)."""
    world = table.shape[0]
    local = torch.arange(table.shape[1])
    variants = {
        "your queries' positions pos[r] for every block's keys":
            lambda s, src: (table[rank], table[rank], True),
        "the positions of rank (r + s) % W, the wrong direction round the ring":
            lambda s, src: (table[rank], table[(rank + s) % world], True),
        "a local triangular mask (tril) on every block":
            lambda s, src: (local, local, True),
        "a mask on the diagonal block only": lambda s, src: (table[rank], table[src], s == 0),
    }
    mine = table[rank]
    out = {}
    for text, pick in variants.items():
        acc = empty_partial(q[..., mine, :])
        for s in range(world):
            src = (rank - s) % world
            qp, kp, causal = pick(s, src)
            part = block_attention(q[..., mine, :], k[..., table[src], :], v[..., table[src], :],
                                   qp, kp, causal=causal)
            acc = merge_partials(*acc, *part)
        out[text] = acc[0]
    return out


def _values(results: list, cases: list[dict], world: int) -> None:
    passed_plain = set()
    for i, case in enumerate(cases):
        q, k, v = inputs(case["seed"], world * N, case["dtype"], case["scale"])
        pos = torch.arange(world * N)
        want_out, want_lse = reference(q, k, v, pos, pos, case["causal"])
        for rank in range(world):
            got = results[rank][i]
            mine = case["table"][rank]
            w_out, w_lse = want_out[..., mine, :], want_lse[..., mine]
            for name, x, want in (("out", got["out"], w_out), ("lse", got["lse"], w_lse)):
                if not isinstance(x, Tensor) or x.shape != want.shape:
                    fail(f"{case['name']}: {name} should be a tensor of shape "
                         f"{tuple(want.shape)}, got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}",
                         rank=rank, hint="out (B, H, n, D) and lse (B, H, n) of this rank's "
                         "n tokens")
            ok = all(torch.allclose(x.double(), w, equal_nan=False, **case["tol"])
                     for x, w in ((got["out"], w_out), (got["lse"], w_lse)))
            if ok:
                continue
            hint = lse_story(got["out"], got["lse"], w_lse)
            if hint is None and case["causal"] and case["layout"] in passed_plain:
                hint = MASK
                for text, alt in _wrong_mask(q.double(), k.double(), v.double(),
                                             case["table"], rank).items():
                    if torch.allclose(got["out"].double(), alt, rtol=1e-6, atol=1e-8):
                        hint = f"your output is what {text} gives: {MASK}"
                        break
            assert_close(got["lse"], w_lse, name=f"{case['name']}: lse", rank=rank, hint=hint,
                         **case["tol"])
            assert_close(got["out"], w_out, name=f"{case['name']}: out", rank=rank, hint=hint,
                         **case["tol"])
        if not case["causal"]:
            passed_plain.add(case["layout"])


def _overlap(events: list[tuple]) -> tuple[int, int]:
    """(block computations with no receive in flight, block computations)."""
    posted = waited = idle = computed = 0
    for event in events:
        if event[0] == "post" and event[1] == "irecv":
            posted += 1
        elif event[0] == "wait" and event[1] == "irecv":
            waited += 1
        elif event[0] == "compute":
            computed += 1
            idle += posted <= waited
    return idle, computed


def check_ring_forward(fn: Callable, *, world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                       quiet: bool = False) -> None:
    """Ring attention forward on `world_size` ranks: see the module docstring."""
    not_reexport(fn, name="ring_attention")
    world, cases = world_size, _cases(world_size)
    results = run_ranks(_forward_worker, world, fn, cases, what="ring_attention",
                        timeout=timeout)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            check_protocol(res["events"], rank, world, "ring_attention", case["name"])
    _values(results, cases, world)
    for rank in range(world):
        for case, res in zip(cases, results[rank], strict=True):
            idle, computed = _overlap(res["events"])
            if computed == 0:
                fail(f"{case['name']}: no call of block_attention was seen", rank=rank,
                     hint=NO_BLOCKS)
            if world > 1 and idle > 1:
                fail(f"{case['name']}: {idle} of the {computed} blocks were computed with no "
                     "transfer in flight; only the last step has nothing left to receive",
                     rank=rank, hint=OVERLAP)
    if not quiet:
        print(f"ring_attention OK on {world} ranks: {len(cases)} cases (contiguous, striped and "
              "zigzag; causal and not; float64 to 1e-10, float32 with large scores to 1e-4); "
              "isend/irecv with neighbours only; each block computed while the next one flew")
