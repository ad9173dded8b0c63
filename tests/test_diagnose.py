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


def test_ranks_that_made_different_groups_are_stopped_at_once() -> None:
    """Module 07, exercise 1c written with each rank creating only its own groups (4 ranks,
    DP 2 x EP 2): rank 2's second dist.new_group([0, 2]) is not matched by ranks 1 and 3,
    which made [1, 3] instead, and the other three wait in an all-reduce over the world that
    rank 2 never reaches. A new_group is collective over the world, counted per group made
    (comm.posted_key("new_group", members)); before, its wait had no count and the run sat
    out the whole timeout (20 s)."""
    world = [0, 1, 2, 3]
    made = {r: {posted_key("new_group", world): 1,
                posted_key("new_group", [0, 2] if r % 2 == 0 else [1, 3]): 1} for r in world}

    def in_all_reduce(rank: int) -> dict:
        return {"state": "in", "what": "all_reduce", "kind": "all_reduce", "group": world,
                "seq": 1, "call": 3, "t": time.time() - 3 * SURE_HANG_S,
                "posted": {**made[rank], posted_key("all_reduce", world): 1}}

    stuck = {"state": "in", "what": "new_group(ranks [0, 2])", "kind": "new_group",
             "group": world, "members": [0, 2], "seq": 1, "call": 2,
             "t": time.time() - 3 * SURE_HANG_S, "posted": made[2]}
    reason = _watch(in_all_reduce(0), in_all_reduce(1), stuck, in_all_reduce(3))._sure_hang({})
    assert reason is not None and reason.startswith(
        "deadlock: rank 2 waits in new_group(ranks [0, 2]) (its call #1 for that group; rank 1 "
        "has made 0)"), reason
    assert "create different groups" in reason, reason
    # the same wait, with every rank having made [0, 2] too (a slow rank, not a hang)
    for r in world:
        made[r][posted_key("new_group", [0, 2])] = 1
    slow = _watch(in_all_reduce(0), in_all_reduce(1), stuck, in_all_reduce(3))._sure_hang({})
    assert slow is None, slow


def test_groups_crossed_at_the_same_count_are_named() -> None:
    """The same mistake, another run: ranks 1, 2 and 3 come out of their new_group calls
    (torch names a group by a count of the groups made, so [0, 2] and [1, 3], both first, meet
    under one name) and wait in all-reduces that every member posted, while rank 0 still waits
    in new_group([0, 2]), which rank 2 made too: no count says a wait cannot end, but rank 1
    made two groups and never [0, 2], which rank 0 made as its first."""
    world = [0, 1, 2, 3]
    first = {r: [0, 2] if r % 2 == 0 else [1, 3] for r in world}
    second = {r: [0, 1] if r < 2 else [2, 3] for r in world}

    def in_all_reduce(rank: int) -> dict:
        made = {posted_key("new_group", first[rank]): 1,
                posted_key("new_group", second[rank]): 1}
        return {"state": "in", "what": "all_reduce", "kind": "all_reduce",
                "group": first[rank], "seq": 1, "call": 3, "t": time.time() - 3 * SURE_HANG_S,
                "posted": {**made, posted_key("all_reduce", first[rank]): 1}}

    stuck = {"state": "in", "what": "new_group(ranks [0, 2])", "kind": "new_group",
             "group": world, "members": [0, 2], "seq": 1, "call": 1,
             "t": time.time() - 3 * SURE_HANG_S,
             "posted": {posted_key("new_group", [0, 2]): 1}}
    states = [stuck, in_all_reduce(1), in_all_reduce(2), in_all_reduce(3)]
    reason = _watch(*states)._sure_hang({})
    assert reason is not None and reason.startswith(
        "deadlock: rank 0 made the group [0, 2], which rank 1 never made"), reason
    # right: every rank makes [0, 2], [1, 3] in that order; rank 0 is slow, still in its
    # first, while the others wait in all-reduces: the others' groups include rank 0's
    for r in (1, 2, 3):
        states[r]["posted"][posted_key("new_group", [0, 2])] = 1
        states[r]["posted"][posted_key("new_group", [1, 3])] = 1
        states[r]["posted"].pop(posted_key("new_group", second[r]))
    assert _watch(*states)._crossed_groups(time.time(), {}) is None
