r"""Exercise 1 of module 05, `check_merge(merge)`: the online-softmax merge of two partials.

Partial results of `parlab.cp.block_attention` over disjoint key blocks, merged by the
learner, against float64 softmax attention over all the keys: float64 cases to 1e-10
(blocking only reorders sums), including a fully masked block (lse -inf) first, second and on
both sides, and four blocks folded from the empty partial (0, -inf); float32 cases against
the float64 reference to rtol 1e-5 (scores near 1) and 1e-4 (scores up to ~200, where
float32's exp would overflow without the max shift). Block sizes are not powers of two. The
inputs must be left unchanged, and out and lse come back in the dtypes given. parlab's own
`merge_partials` is refused while the learner's merge runs.

A right answer must not depend on the block sizes (3 to 11 keys), on which block is fully
masked (the first, the second, both), on the dtype and the size of the scores, on the order
of the merges (four blocks folded from the empty partial) or on the batch, heads and head
size (one case has 2, 3 and 5 instead of 1, 2 and 8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from parlab.check._compare import assert_close, assert_unchanged, fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.check.cp.common import (
    BF16,
    F32_TOL,
    F64_TOL,
    LARGE_TOL,
    OTHER_DIMS,
    SEED,
    WEIGHTS,
    B,
    D,
    H,
    inputs,
    lse_story,
    reference,
)
from parlab.cp import blocks
from parlab.cp.blocks import block_attention, empty_partial

__all__ = ["check_merge"]

IN_PLACE = ("compute new tensors (out = w_a * out_a + w_b * out_b) instead of writing into "
            "out_a or lse_a (out_a.mul_(...), out_a *= ...): the caller may still need its "
            "partials, and the ring passes the same accumulators in again")


def _merge_cases() -> list[dict[str, Any]]:
    """name, query positions, key blocks, causal, dtype, scale, tolerance, start empty?"""
    ar = torch.arange
    striped = [ar(r, 20, 4) for r in range(4)]
    f64 = {"dtype": torch.float64, "scale": 1.0, "tol": F64_TOL}
    return [
        {"name": "two key blocks, float64", "q": ar(0, 5), "blocks": [ar(0, 5), ar(5, 12)],
         "causal": False, **f64},
        {"name": "causal, the second block fully masked (lse -inf), float64", "q": ar(0, 6),
         "blocks": [ar(0, 6), ar(6, 13)], "causal": True, **f64},
        {"name": "causal, the first block fully masked, float64", "q": ar(0, 6),
         "blocks": [ar(6, 13), ar(0, 6)], "causal": True, **f64},
        {"name": "causal, both blocks fully masked (expect out 0, lse -inf), float64",
         "q": ar(0, 3), "blocks": [ar(3, 6), ar(6, 9)], "causal": True, **f64},
        {"name": "causal, four striped blocks folded from the empty partial (0, -inf), float64",
         "q": ar(1, 20, 4), "blocks": striped, "causal": True, "empty": True, **f64},
        {"name": "three blocks, float32", "q": ar(0, 6), "blocks": [ar(0, 5), ar(5, 11),
                                                                  ar(11, 18)],
         "causal": False, "dtype": torch.float32, "scale": 1.0, "tol": F32_TOL},
        {"name": "float32 with large scores (lse up to ~200)", "q": ar(0, 6),
         "blocks": [ar(0, 7), ar(7, 18)], "causal": False, "dtype": torch.float32,
         "scale": 60.0, "tol": LARGE_TOL},
        {"name": f"causal, other sizes (batch {OTHER_DIMS[0]}, {OTHER_DIMS[1]} heads of "
         f"{OTHER_DIMS[2]}), float64", "q": ar(2, 9), "blocks": [ar(0, 4), ar(4, 9)],
         "causal": True, "dims": OTHER_DIMS, **f64},
    ]


def _merged(merge: Callable, got: tuple[Tensor, Tensor], part: tuple[Tensor, Tensor],
            name: str) -> tuple[Tensor, Tensor]:
    args = (*got, *part)
    kept = [x.clone() for x in args]
    out = call_learner(f"merge ({name})", merge, *args, refuse=[blocks.merge_partials],
                       refusal="parlab.cp.merge_partials")
    for label, before, after in zip(("out_a", "lse_a", "out_b", "lse_b"), kept, args,
                                    strict=True):
        assert_unchanged(before, after, name=f"{label} (merge, {name})", hint=IN_PLACE)
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, Tensor)
                                                             for x in out)):
        fail(f"{name}: merge returned {type(out).__name__}, expected a tuple (out, lse) of "
             "tensors", hint="return out, lse")
    return out[0], out[1]


def _merge_case(merge: Callable, case: dict[str, Any], seed: int) -> None:
    q_pos, key_blocks, name = case["q"], case["blocks"], case["name"]
    seq = int(max(int(b.max()) for b in key_blocks)) + 1
    q_all, k, v = inputs(seed, max(seq, int(q_pos.max()) + 1), case["dtype"], case["scale"],
                         dims=case.get("dims", (B, H, D)))
    q = q_all[..., q_pos, :]  # (B, H, nq, D)
    parts = [block_attention(q, k[..., b, :], v[..., b, :], q_pos, b, causal=case["causal"])
             for b in key_blocks]
    keys = torch.cat(key_blocks)
    want_out, want_lse = reference(q, k[..., keys, :], v[..., keys, :], q_pos, keys,
                                   case["causal"])
    got = empty_partial(q) if case.get("empty") else parts[0]
    for part in parts[0 if case.get("empty") else 1:]:
        got = _merged(merge, got, part, name)
    out, lse = got
    for label, x, want in (("out", out, want_out), ("lse", lse, want_lse)):
        if x.shape != want.shape:
            fail(f"{name}: {label} has shape {tuple(x.shape)}, expected {tuple(want.shape)}",
                 hint="out is (B, H, n, D) and lse (B, H, n), the shapes of the inputs")
    story = lse_story(out, lse, want_lse, [p[1] for p in parts])
    assert_close(lse, want_lse, name=f"{name}: the merged lse", hint=story or WEIGHTS,
                 **case["tol"])
    assert_close(out, want_out, name=f"{name}: the merged out", hint=story or WEIGHTS,
                 **case["tol"])
    if out.dtype != parts[0][0].dtype or lse.dtype != parts[0][1].dtype:
        fail(f"{name}: merge returned out {out.dtype} and lse {lse.dtype} for "
             f"{parts[0][0].dtype} partials", hint="return out and lse in the dtype of out_a "
             "and lse_a: " + (BF16 if torch.bfloat16 in (out.dtype, lse.dtype) else
                              "do not cast them"))


@exercise("05.merge")
def check_merge(merge: Callable, *, seed: int = SEED, quiet: bool = False) -> None:
    """merge(out_a, lse_a, out_b, lse_b) -> (out, lse): see the module docstring."""
    not_reexport(merge, name="merge")
    cases = _merge_cases()
    for i, case in enumerate(cases):
        _merge_case(merge, case, seed + i)
    if not quiet:
        print(f"merge OK: {len(cases)} cases against softmax attention over all the keys, "
              "fully masked blocks included; float64 to 1e-10, float32 to 1e-5 (1e-4 with "
              "scores up to ~200); inputs left unchanged")
