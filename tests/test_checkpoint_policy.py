"""The checkpoint-interval model (parlab.costs.checkpointing) against arithmetic written out
here and against a numeric minimisation done here (a log grid, then golden sections): Young's
sqrt(2 δ M) and its overhead sqrt(2δ/M) + R/M, an async save's max(sqrt(2 δ M), w), and the
mode that wins on each side of the point where the background write outlasts the interval."""

from __future__ import annotations

import math

import pytest

from parlab import costs


def minimise(f, lo: float, hi: float) -> tuple[float, float]:
    """(x, f(x)) at the smallest of f on [lo, hi]: 4000 log-spaced points, then golden sections
    between the best point's neighbours (f need not be smooth: the async wait has a kink)."""
    xs = [lo * (hi / lo) ** (i / 3999) for i in range(4000)]
    i = min(range(len(xs)), key=lambda j: f(xs[j]))
    a, b = xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        c, d = b - g * (b - a), a + g * (b - a)
        a, b = (a, d) if f(c) <= f(d) else (c, b)
    x = (a + b) / 2
    return x, f(x)


def test_overhead_is_the_written_out_sum():
    # δ = 60 s every 600 s, half an interval lost per failure, R = 300 s, M = 10,000 s
    got = costs.checkpoint_overhead(600, mtbf=10_000, save_stall=60, restart=300)
    assert got == pytest.approx(60 / 600 + (300 + 300) / 10_000, rel=1e-12)
    # async: a 900 s write against a 600 s interval: every save first waits 300 s more
    got = costs.checkpoint_overhead(600, mtbf=10_000, save_stall=5, restart=300, write=900)
    assert got == pytest.approx((5 + 300) / 600 + (300 + 900 + 300) / 10_000, rel=1e-12)


@pytest.mark.parametrize(("delta", "mtbf", "restart"), [(60, 11_134, 0), (60, 11_134, 900),
                                                        (3, 1_800, 120), (300, 86_400, 1_800)])
def test_young_matches_a_numeric_minimisation(delta, mtbf, restart):
    tau, best = minimise(lambda t: costs.checkpoint_overhead(
        t, mtbf=mtbf, save_stall=delta, restart=restart), 1e-2, 10 * mtbf)
    assert costs.young_interval(delta, mtbf) == pytest.approx(tau, rel=1e-4)
    assert costs.young_interval(delta, mtbf) == pytest.approx(math.sqrt(2 * delta * mtbf))
    assert costs.optimal_overhead(delta, mtbf, restart=restart) == pytest.approx(best, rel=1e-9)
    assert costs.best_interval(mtbf=mtbf, save_stall=delta) == pytest.approx(tau, rel=1e-4)


def test_restart_moves_the_overhead_not_the_interval():
    without = costs.optimal_overhead(60, 10_000)
    assert costs.optimal_overhead(60, 10_000, restart=500) - without == pytest.approx(0.05)
    assert math.sqrt(2 * 60 / 10_000) == pytest.approx(without)


def test_daly_is_young_minus_delta_to_first_order():
    # Daly 2006: sqrt(2δM)(1 + sqrt(δ/2M)/3 + δ/(18M)) - δ, and M when δ >= 2M
    delta, mtbf = 60.0, 11_134.0
    x = delta / (2 * mtbf)
    assert costs.daly_interval(delta, mtbf) == pytest.approx(
        math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta)
    assert abs(costs.daly_interval(delta, mtbf) - costs.young_interval(delta, mtbf)) < delta
    assert costs.daly_interval(30_000, 10_000) == 10_000


@pytest.mark.parametrize(("stall", "write", "mtbf"), [(4, 60, 11_134), (4, 900, 3_600),
                                                      (1, 5_000, 2_000), (2, 1e5, 1e4)])
def test_async_best_interval_matches_a_numeric_minimisation(stall, write, mtbf):
    def f(t):
        return costs.checkpoint_overhead(t, mtbf=mtbf, save_stall=stall, write=write)
    tau, best = minimise(f, 1e-2, 100 * mtbf)
    got = costs.best_interval(mtbf=mtbf, save_stall=stall, write=write)
    assert f(got) == pytest.approx(best, rel=1e-7)
    assert got == pytest.approx(tau, rel=1e-3)
    if write < 2 * mtbf:  # the closed form of the docstring
        assert got == pytest.approx(max(math.sqrt(2 * stall * mtbf), write))


CASES = {  # mtbf, sync save, async stall, async write, restart -> the mode that wins
    "Llama 3's failure rate, a 60 s save": ((54 * 86400 / 419, 60, 4, 90, 600), "async"),
    "the write outlasts sync's interval": ((3_600, 120, 10, 900, 600), "sync"),
    "a fast save, a slow background write": ((1_800, 5, 1, 400, 60), "sync"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_best_policy_is_the_numeric_best_of_both_modes(name):
    (mtbf, sync, stall, write, restart), mode = CASES[name]
    found = {}
    for m in costs.SAVE_MODES:
        found[m] = minimise(lambda t, m=m: costs.policy_overhead(
            m, t, mtbf=mtbf, sync_save=sync, async_stall=stall, async_write=write,
            restart=restart), 1e-2, 100 * mtbf)
    policy = costs.best_policy(mtbf=mtbf, sync_save=sync, async_stall=stall, async_write=write,
                               restart=restart)
    assert policy.mode == mode == min(found, key=lambda m: found[m][1])
    assert policy.overhead == pytest.approx(found[mode][1], rel=1e-7)
    assert policy.interval == pytest.approx(found[mode][0], rel=1e-3)


def test_checkpoint_bytes_and_refusals():
    assert costs.checkpoint_bytes(70e9, writers=256) == pytest.approx(70e9 * 14 / 256)
    with pytest.raises(ValueError, match="interval must be"):
        costs.checkpoint_overhead(0, mtbf=1, save_stall=1)
    with pytest.raises(ValueError, match="mode must be"):
        costs.policy_overhead("lazy", 1, mtbf=1, sync_save=1, async_stall=1,  # type: ignore
                              async_write=1)
