"""parlab.model.recompute: what each recomputation policy keeps, what it costs, and that it
changes nothing else.

References computed here, independently of the library: Korthikanti et al.'s per-layer bytes
written out from their table (sbh(34 + 5as/h), 34sbh, 2sbh, with 2-byte activations), plus the
LayerNorm statistics the paper leaves out (two LayerNorms, a mean and a reciprocal standard
deviation per token, 2 bytes each); the matmul FLOPs summed GEMM by GEMM here; and the
gradients of the same layer without recomputation.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from parlab.model.recompute import (
    POLICIES,
    RecomputeLayer,
    layer_flops,
    recompute_flops,
    saved_activation_bytes,
)

B, S, H, A = 2, 24, 48, 4  # s is not a power of two, and as/h = 2: the s^2 term is visible


def _layer(policy: str, dtype: torch.dtype = torch.bfloat16) -> RecomputeLayer:
    torch.manual_seed(0)
    return RecomputeLayer(H, A, p_drop=0.1, recompute=policy).to(dtype)


def _x(dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(B, S, H, dtype=dtype, generator=torch.Generator().manual_seed(1),
                       requires_grad=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_saved_bytes_match_korthikanti_per_policy(policy):
    sbh, ln_stats = S * B * H, 2 * 2 * 2 * S * B
    expected = {"none": sbh * 34 + 5 * A * S * S * B + ln_stats,
                "selective": sbh * 34 + ln_stats,
                "full": 2 * sbh}[policy]
    assert saved_activation_bytes(_layer(policy), _x()) == expected


def test_selective_removes_exactly_the_attention_scores():
    none = saved_activation_bytes(_layer("none"), _x())
    selective = saved_activation_bytes(_layer("selective"), _x())
    # softmax output (2 bytes), its dropout mask (1) and the dropout output (2), per score
    assert none - selective == 5 * A * S * S * B


def _grads(policy: str) -> list[torch.Tensor]:
    layer, x = _layer(policy, torch.float32), _x(torch.float32)
    torch.manual_seed(7)  # the dropout masks: the same draws for every policy
    layer(x).square().sum().backward()
    return [x.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_recomputation_changes_no_gradient(policy):
    for got, want in zip(_grads(policy), _grads("none"), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # same ops, same masks


@pytest.mark.parametrize("policy", POLICIES)
def test_extra_forward_flops_are_counted(policy):
    layer, x = _layer(policy, torch.float32), _x(torch.float32)
    with FlopCounterMode(display=False) as counter:
        layer(x).sum().backward()
    gemms = 2 * B * S * H * (3 * H) + 2 * B * S * S * H * 2 + 2 * B * S * H * H \
        + 2 * B * S * H * (4 * H) * 2  # qkv, scores and times V, proj, fc1 and fc2
    assert layer_flops(B, S, H) == gemms
    # selective: only the scores GEMM is redone (torch stops recomputing once the dropout
    # output that "times V" needs is back); full: the whole forward again
    extra = {"none": 0, "selective": 2 * B * S * S * H, "full": gemms}[policy]
    assert recompute_flops(B, S, H, policy) == extra
    assert counter.get_total_flops() == 3 * gemms + extra  # forward 1x, backward 2x


def test_bad_policy_and_heads_are_refused():
    with pytest.raises(ValueError, match="recompute must be one of"):
        RecomputeLayer(H, A, recompute="some")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        RecomputeLayer(50, 4)
