r"""Exercise 2 of module 04, `check_p2p_step(forward_step, backward_step, one_f_one_b)`.

The learner's two step functions run every action of GPipe, then of the learner's own 1F1B
order from exercise 1 (parlab's, while `one_f_one_b` is not written yet), on p = world_size
ranks inside parlab's loop (`parlab.pp.executor`; sizes in `parlab.check.pp.common`: m = 2p + 1
microbatches of 3 rows, 3 layers per stage). Before each point-to-point call its tensor must
have the activation's shape and dtype and a send must not block (`P2PGuard`); after each
action the tracer's record of its calls must be what the action needs (F: a recv from the
previous stage unless first, an isend to the next unless last; B the other way round), so a
missing or misdirected message is named at the action that made it, before anything hangs.
Then the summed loss and every weight gradient are compared with the single-device,
full-batch run (float64, rtol 1e-9, atol 1e-12), and no rank may hold more microbatches than
the schedule needs (min(p - r, m) under 1F1B).

A right answer must not depend on p or on which stage a rank is: the visible test runs 2
ranks and 3, whose middle stage both receives and sends (on 2 ranks the first and the last
stage are each other's only neighbours, so peers written in as 0 and p - 1 pass there), the
hidden one 4; nor on m = 2p + 1 (5, 7, 9: never p, never the rows of a micro-batch, 3), the
schedule (GPipe, then the learner's own 1F1B order), the dtype (float64, not torch's default)
or the upstream gradient (received from the next stage, except on the last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parlab.check._compare import fail
from parlab.check._harness import CHECK_TIMEOUT_S, call_learner, exercise, not_reexport, run_checked
from parlab.check.pp.common import BLOCKING, HANG, P2PGuard, compare, model_options, options
from parlab.check.pp.schedule import schedule_shape
from parlab.pp import schedules as pp
from parlab.pp.order import validate
from parlab.pp.simulator import simulate

__all__ = ["check_p2p_step"]

BUFFER = ("receive into torch.empty(ctx.shape, dtype=ctx.dtype): torch.empty's default dtype "
          "is float32 and this model runs in float64; send y.detach() and x.grad as they are")
EXERCISE_1 = ("this check runs your steps under your own one_f_one_b from exercise 1: fix "
              "that first (its own test above says how)")
# One hint for a misdirected recv and a misdirected send: which of the two ranks reports first
# is a race, and both come from the same mistake.
DIRECTIONS = ("activations come from ctx.prev_rank and go to ctx.next_rank; gradients come from "
              "ctx.next_rank and go to ctx.prev_rank")


def _expect(a: pp.Action, ctx: Any, events: list, name: str, fn: str) -> None:
    """Fail on this rank unless action `a` made exactly the point-to-point calls it needs."""
    first, last, r = ctx.is_first, ctx.is_last, ctx.rank
    forward = a.kind == "F"
    recvs = [e for e in events if e.kind in ("recv", "irecv")]
    sends = [e for e in events if e.kind in ("send", "isend")]
    where = f"{fn}(ctx, {a.microbatch}) ({name}, stage {r} of {ctx.p})"
    thing = "its input activation" if forward else "the gradient of its output"
    src, need_recv = (ctx.prev_rank, not first) if forward else (ctx.next_rank, not last)
    if need_recv and not recvs:
        peer = "ctx.prev_rank" if forward else "ctx.next_rank"
        fail(f"{where} made no recv: {thing} comes from rank {src}, which sent it with "
             "dist.isend", rank=r, hint=f"a missing recv: receive {thing} into a new tensor "
             f"of shape ctx.shape with dist.recv(buffer, src={peer}) before computing")
    if not need_recv and recvs:
        fail(f"{where} received from rank {list(recvs[0].group_ranks)}, but this stage is the "
             f"{'first' if forward else 'last'}: "
             + ("its input is ctx.inputs[mb]" if forward else "its backward starts from its "
                "own loss"), rank=r, hint="check ctx.is_first / ctx.is_last before receiving")
    if len(recvs) > 1:
        fail(f"{where} made {len(recvs)} recvs, expected 1", rank=r,
             hint=f"one action receives one tensor: {thing}")
    if recvs and tuple(recvs[0].group_ranks) != (src,):
        fail(f"{where} received from rank {list(recvs[0].group_ranks) or 'any'}; {thing} comes "
             f"from rank {src}", rank=r, hint=DIRECTIONS)
    dst, need_send = (ctx.next_rank, not last) if forward else (ctx.prev_rank, not first)
    out = "its output activation" if forward else "the gradient of its input"
    if need_send and len(sends) != 1:
        fail(f"{where} made {len(sends)} sends, expected one isend of {out} to rank {dst}",
             rank=r, hint=f"the next step of this microbatch runs on rank {dst} and waits for it")
    if not need_send and sends:
        fail(f"{where} sent to rank {list(sends[0].group_ranks)}, but this stage is the "
             f"{'last' if forward else 'first'}: nothing to send", rank=r,
             hint="check ctx.is_first / ctx.is_last before sending")
    if sends and tuple(sends[0].group_ranks) != (dst,):
        fail(f"{where} sent {out} to rank {list(sends[0].group_ranks)}, expected rank {dst}",
             rank=r, hint=DIRECTIONS)


def _run_schedule(forward_step: Callable, backward_step: Callable, name: str,
                  schedule: pp.Schedule, opts: dict[str, Any]) -> dict:
    """In a rank: one schedule's actions through the learner's steps."""
    import torch.distributed as dist

    from parlab import comm
    from parlab.pp.executor import make_context
    from parlab.pp.run import rank_result

    rank, p = dist.get_rank(), dist.get_world_size()
    ctx, index = make_context(p, opts["m"], 1, **model_options(opts))
    peak = 0  # no barrier between schedules: see parlab.pp.execute
    for a in schedule[rank]:
        fn, label = (forward_step, "forward_step") if a.kind == "F" else \
            (backward_step, "backward_step")
        where = f"{label}(ctx, {a.microbatch}) ({name}, stage {rank} of {p})"
        guard = P2PGuard(ctx.shape, ctx.dtype, rank=rank, where=where, buffer_hint=BUFFER,
                         what="activations and their gradients", blocking_send=BLOCKING)
        with comm.trace() as tr, guard:
            call_learner(where, fn, ctx, a.microbatch)
        _expect(a, ctx, tr.events, name, label)
        peak = max(peak, len(ctx.saved))
    for handle in ctx.sends:
        (handle[0] if isinstance(handle, tuple) else handle).wait()
    return dict(rank_result(ctx, index), peak=peak, left=len(ctx.saved))


def _p2p_worker(forward_step: Callable, backward_step: Callable,
                schedules: dict[str, pp.Schedule], opts: dict[str, Any]) -> dict:
    return {name: _run_schedule(forward_step, backward_step, name, schedule, opts)
            for name, schedule in schedules.items()}


def learner_1f1b(fn: Callable[[int, int], pp.Schedule] | None, p: int,
                 m: int) -> tuple[pp.Schedule, str]:
    """The learner's 1F1B order for (p, m), validated, and whose it is (for the summary).
    Not written yet (NotImplementedError): parlab's, so exercise 2 is checked on its own."""
    if fn is None:
        return pp.make_schedule("1f1b", p, m), "parlab's 1F1B"
    try:
        sched = call_learner(f"your one_f_one_b({p}, {m}) (exercise 1)", fn, p, m,
                             hint=EXERCISE_1)
    except NotImplementedError:
        return pp.make_schedule("1f1b", p, m), ("parlab's 1F1B (your one_f_one_b is not "
                                                "written yet)")
    schedule_shape(sched, p, m)
    try:
        validate(sched)
    except pp.ScheduleError as err:
        fail(f"your one_f_one_b({p}, {m}) (exercise 1) cannot run: {err}", hint=EXERCISE_1)
    return [list(order) for order in sched], "your 1F1B"


@exercise("04.p2p", needs={"04.1f1b": "one_f_one_b (exercise 1)"})
def check_p2p_step(forward_step: Callable, backward_step: Callable,
                   one_f_one_b: Callable[[int, int], pp.Schedule] | None = None, *,
                   world_size: int = 2, timeout: float = CHECK_TIMEOUT_S,
                   quiet: bool = False) -> None:
    """Exercise 2: the learner's per-action steps under GPipe and 1F1B match one device."""
    not_reexport(forward_step, name="forward_step")
    not_reexport(backward_step, name="backward_step")
    opts = options(world_size)
    p, m = world_size, opts["m"]
    mine, whose = learner_1f1b(one_f_one_b, p, m)
    schedules = {"gpipe": pp.make_schedule("gpipe", p, m), "1f1b": mine}
    results = run_checked(_p2p_worker, p, forward_step, backward_step, schedules, opts,
                          what="your forward_step and backward_step", timeout=timeout,
                          hang_hint=HANG, backend="gloo")
    for name, schedule in schedules.items():
        peaks = simulate(schedule).peak_activations
        compare([res[name] for res in results], name, opts, peaks)
    if not quiet:
        print(f"forward_step and backward_step OK on {p} ranks under GPipe and {whose} "
              f"(m = {m}, {opts['n_layers']} layers): loss and every gradient equal the "
              f"single-device run (rtol 1e-9); 1F1B peak per rank "
              f"{[res['1f1b']['peak'] for res in results]}")
