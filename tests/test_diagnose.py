"""The launcher's diagnosis of a sure hang (parlab.launch.diagnose.Watch), from status lines
written here by hand: which rule speaks decides what the learner reads."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from parlab.comm import posted_key
from parlab.launch.diagnose import P2P_CYCLE_S, SURE_HANG_S, Watch
from parlab.launch.errors import CollectiveTimeout


def _watch(*states: dict) -> Watch:
    return Watch([SimpleNamespace(raw=json.dumps(s).encode()) for s in states], timeout=8.0)


def _waiting(since: float) -> dict:
    """Rank 0 in its first all_reduce over ranks [0, 1] since `since` seconds ago."""
    return {"state": "in", "what": "all_reduce", "kind": "all_reduce", "group": [0, 1],
            "seq": 1, "call": 1, "posted": {posted_key("all_reduce", [0, 1]): 1},
            "t": time.time() - since}


def test_a_rank_that_returned_late_is_named_as_having_skipped_the_collective() -> None:
    """Rank 1 skips the all-reduce but, on a loaded machine, returns after rank 0 began to
    wait: until it has been gone SURE_HANG_S nothing is said, then the skip is named (not "the
    ranks call collectives over different groups", the rule for ranks that all still wait)."""
    just_returned = {"state": "returned", "posted": {}, "t": time.time() - SURE_HANG_S / 4}
    watch = _watch(_waiting(3 * SURE_HANG_S), just_returned)
    assert watch._sure_hang({}) is None and watch._sure_hang({1: None}) is None
    gone = {"state": "returned", "posted": {}, "t": time.time() - 2 * SURE_HANG_S}
    reason = _watch(_waiting(3 * SURE_HANG_S), gone)._sure_hang({1: None})
    assert reason is not None and "skipped a collective" in reason, reason


def test_ranks_stuck_over_different_groups_are_named_by_their_counts() -> None:
    """Three ranks, each waiting in an all-reduce over a pair that the other member never
    joins: nobody returned, so the counting rule speaks."""
    def waits_over(group: list[int]) -> dict:
        return {"state": "in", "what": "all_reduce", "kind": "all_reduce", "group": group,
                "seq": 1, "call": 1, "posted": {posted_key("all_reduce", group): 1},
                "t": time.time() - 3 * SURE_HANG_S}
    reason = _watch(waits_over([0, 1]), waits_over([1, 2]), waits_over([0, 2]))._sure_hang({})
    assert reason is not None and "rank 1 has made 0 there" in reason, reason
    assert "different groups" in reason, reason


def _sending_to(peer: int, since: float) -> dict:
    """A rank blocked since `since` seconds ago in a send to `peer`."""
    return {"state": "in", "what": f"send to rank {peer}", "kind": "send", "group": [peer],
            "p2p": True, "seq": 1, "call": 1, "t": time.time() - since}


def _stopped(timeout: float) -> str:
    watch = Watch([SimpleNamespace(raw=json.dumps(_sending_to(p, P2P_CYCLE_S + 0.5)).encode())
                   for p in (1, 0)], timeout=timeout)
    watch.all_running_at = time.monotonic() - P2P_CYCLE_S - 0.5
    try:
        watch.check({}, [])
    except CollectiveTimeout as exc:
        assert exc.certain, str(exc)
        return str(exc).splitlines()[0]
    raise AssertionError("a cycle of blocking sends was not stopped")


def test_a_certain_hang_says_whether_it_stopped_early_or_at_its_timeout() -> None:
    """Two ranks each blocked in a send to the other: the cycle rule needs P2P_CYCLE_S of
    waiting. Under a longer timeout the run stops early and says so; under a timeout no
    longer than that it stopped at its timeout, and says that, not 'stopped after 3.0 s: the
    hang is certain' (module 00's demonstration with timeout=3 read so, issue 44.4)."""
    early = _stopped(10.0)
    assert "stopped early" in early and "of its 10 s timeout" in early, early
    late = _stopped(P2P_CYCLE_S)
    assert f"stopped at its {P2P_CYCLE_S:g} s timeout" in late, late
    assert "early" not in late and "by then the hang was certain" in late, late
