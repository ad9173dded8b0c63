"""parlab.compose.titan.checkpoint: one checkpoint format for both builds of module 08's Llama.

The torch-API model (DeviceMesh, TP + SP, FSDP2, pipelining) saves with PyTorch's
`get_model_state_dict` / `get_optimizer_state_dict` and DCP, renamed to the course's names;
another grid of it and the course's composed model (`parlab.compose.load_state`) load that
checkpoint and continue; the composed model's checkpoint loads into the torch-API model. Every
continued step is held to the uninterrupted single-device run's loss at that step.
"""

from __future__ import annotations

import pytest

from parlab.compose import (
    TOLERANCE,
    Plan,
    Position,
    load_state,
    save_state,
    setup,
    train_single,
    train_step,
)
from parlab.compose.titan import setup_titan, titan_step
from parlab.compose.titan.checkpoint import load_titan, save_titan
from parlab.launch import run
from parlab.model import LlamaConfig, load_corpus

CFG, LR, GLOBAL = LlamaConfig(), 3e-3, 8
SAVED_AT = 2  # steps before the first checkpoint


def round_trips(root: str) -> dict[str, list[float]]:
    """On 4 ranks: torch API on DP2 × PP2 saves after 2 steps; the torch API on DP2 × TP2 + SP
    and the composed model on DP2 × PP2 continue from it; the composed model saves after its
    step 3 and the torch API on DP4 continues from that."""
    tokens, _ = load_corpus()
    out = {}
    rep = setup_titan(CFG, Plan(dp=2, pp=2, micro_batch_size=2), lr=LR)
    out["saved"] = [titan_step(rep, i, tokens) for i in range(SAVED_AT)]
    save_titan(rep, f"{root}/titan", Position(SAVED_AT, SAVED_AT * GLOBAL))

    rep = setup_titan(CFG, Plan(dp=2, tp=2, sequence_parallel=True, micro_batch_size=2), lr=LR)
    start = load_titan(rep, f"{root}/titan")
    out["torch API, DP2 x TP2 SP"] = [titan_step(rep, i, tokens) for i in range(start.step, 4)]

    composed = setup(CFG, Plan(dp=2, pp=2, micro_batch_size=2), lr=LR)
    start = load_state(composed, f"{root}/titan").position
    out["composed, DP2 x PP2"] = [train_step(composed, i, tokens) for i in range(start.step, 4)]
    save_state(composed, f"{root}/composed", Position(4, 4 * GLOBAL))

    rep = setup_titan(CFG, Plan(dp=4, micro_batch_size=2), lr=LR)
    start = load_titan(rep, f"{root}/composed")
    out["torch API from composed, DP4"] = [titan_step(rep, i, tokens) for i in range(start.step, 5)]
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("no_orphans")
def test_one_checkpoint_format_for_both_builds(tmp_path):
    results = run(round_trips, 4, str(tmp_path), timeout=240)
    single = train_single(CFG, 5, global_batch_size=GLOBAL, lr=LR)
    starts = {"saved": 0, "torch API, DP2 x TP2 SP": 2, "composed, DP2 x PP2": 2,
              "torch API from composed, DP4": 4}
    for name, start in starts.items():
        losses = results[0][name]
        assert losses and all(r[name] == losses for r in results), f"{name}: ranks disagree"
        gaps = [abs(a - b) for a, b in zip(losses, single[start:], strict=False)]
        print(f"{name}: steps {start}..{start + len(losses) - 1}, largest gap {max(gaps):.1e}")
        assert max(gaps) <= TOLERANCE, (name, gaps)
