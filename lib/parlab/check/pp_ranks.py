r"""Graded checks of module 04 that run on several ranks (exercises 2 and 3).

Exercise 2, `check_p2p_step(forward_step, backward_step)`: the learner's two functions run
every action of GPipe, then of 1F1B (p = world_size, m = 2p), inside parlab's loop
(`parlab.pp.executor`: 8 layers of width 16 in float64, batch 16). After each action the tracer's
record of its point-to-point calls is compared with what the action needs (F: a recv from
the previous stage unless first, an isend to the next unless last; B the other way round),
so a missing or misdirected message is named at the action that made it, before anything
hangs. Then the summed loss and every weight gradient are compared with the single-device,
full-batch run: float64, where only the order of the additions differs (~1e-16), so
rtol=1e-9, atol=1e-12. Under 1F1B no rank may hold more than min(p - r, m) microbatches.

Exercise 3, `check_placement(stage_of, layers_of)`: stage_of(r, c, p) = c p + r and the
layers of each chunk for several (p, v) by closed form, then interleaved 1F1B (v = 2) runs
on world_size ranks with the model split by the learner's layers_of and must match the
single-device gradients as above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, assert_close, fail, not_reexport, run_checked
from parlab.check.pp import call
from parlab.errors import reference_message, refused
from parlab.pp import schedules as pp

__all__ = ["check_p2p_step", "check_placement", "CheckFailed"]
TOL = {"rtol": 1e-9, "atol": 1e-12}
OPTIONS = {"n_layers": 8, "width": 16, "batch": 16, "seed": 0}
SCALE = ("scale each microbatch's loss by 1/m: the full batch's loss is the mean of the m "
         "microbatch losses, so without 1/m the loss and every gradient come out m times too big")
BLOCKING = ("dist.send waits until the peer has received: under 1F1B rank r sends an "
            "activation forward while rank r + 1 sends it a gradient back, and both wait "
            "forever. Send with dist.isend and append its handle to ctx.sends (they are waited "
            "on at the end)")
HANG = ("a recv whose message is never sent (the peer's step lacks its isend, or sends to "
        "another rank), or a message received by the wrong rank")


_run = functools.partial(run_checked, hang_hint=HANG, backend="gloo")  # pp_run's choice


# --- in the ranks ------------------------------------------------------------------------------

def _expect(a: Any, ctx: Any, events: list, name: str, fn: str) -> None:
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
        fail(f"{where} made {len(recvs)} recvs, expected 1", rank=r)
    if recvs and tuple(recvs[0].group_ranks) != (src,):
        fail(f"{where} received from rank {list(recvs[0].group_ranks) or 'any'}; {thing} comes "
             f"from rank {src}", rank=r, hint="activations come from ctx.prev_rank, gradients "
             "from ctx.next_rank")
    dst, need_send = (ctx.next_rank, not last) if forward else (ctx.prev_rank, not first)
    out = "its output activation" if forward else "the gradient of its input"
    if any(e.kind == "send" for e in sends):
        fail(f"{where} sent with a blocking dist.send", rank=r, hint=BLOCKING)
    if need_send and len(sends) != 1:
        fail(f"{where} made {len(sends)} sends, expected one isend of {out} to rank {dst}",
             rank=r, hint=f"the next step of this microbatch runs on rank {dst} and waits for it")
    if not need_send and sends:
        fail(f"{where} sent to rank {list(sends[0].group_ranks)}, but this stage is the "
             f"{'last' if forward else 'first'}: nothing to send", rank=r)
    if sends and tuple(sends[0].group_ranks) != (dst,):
        fail(f"{where} sent {out} to rank {list(sends[0].group_ranks)}, expected rank {dst}",
             rank=r, hint="activations go to ctx.next_rank, gradients to ctx.prev_rank")


def _p2p_worker(forward_step: Callable, backward_step: Callable, m: int,
                names: tuple[str, ...]) -> dict:
    import torch.distributed as dist

    from parlab import comm
    from parlab.pp.executor import make_context
    from parlab.pp.run import rank_result
    from parlab.pp.schedules import make_schedule

    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in names:
        ctx, index = make_context(p, m, 1, **OPTIONS)
        peak = 0  # no barrier between schedules: see parlab.pp.execute
        for a in make_schedule(name, p, m)[rank]:
            fn = forward_step if a.kind == "F" else backward_step
            label = "forward_step" if a.kind == "F" else "backward_step"
            with comm.trace() as tr:
                call(f"{label}(ctx, {a.microbatch}) ({name})", fn, ctx, a.microbatch,
                     rank=rank)
            _expect(a, ctx, tr.events, name, label)
            peak = max(peak, len(ctx.saved))
        for handle in ctx.sends:
            (handle[0] if isinstance(handle, tuple) else handle).wait()
        out[name] = dict(rank_result(ctx, index), peak=peak, left=len(ctx.saved))
    return out


# --- in the parent -----------------------------------------------------------------------------

def _reference() -> tuple[float, dict[str, torch.Tensor]]:
    from parlab.pp.executor import make_data, make_model, reference

    model = make_model(OPTIONS["n_layers"], OPTIONS["width"], seed=OPTIONS["seed"])
    return reference(model, *make_data(OPTIONS["batch"], OPTIONS["width"], seed=OPTIONS["seed"]))


def _ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    c = float((got * want).sum() / (want * want).sum())
    return c if torch.allclose(got, c * want, **TOL) else None


def _compare(results: list[dict], name: str, m: int) -> None:
    ref_loss, ref_grads = _reference()
    p = len(results)
    loss = results[-1]["loss"]
    if loss is None:
        fail(f"{name}: the last stage recorded no loss", rank=p - 1, hint="forward_step on "
             "the last stage appends this microbatch's loss / m (detached) to ctx.losses")
    if abs(loss - ref_loss) > TOL["rtol"] * abs(ref_loss):
        c = loss / ref_loss
        fail(f"{name}: the microbatch losses add up to {loss:.10g}, the full batch's is "
             f"{ref_loss:.10g} ({c:.4g} times)", rank=p - 1,
             hint=SCALE if abs(c - m) < 1e-6 else "loss_i = ctx.loss_fn(output, "
             "ctx.targets[mb]) / ctx.m on the last stage")
    for r, res in enumerate(results):
        for pname, got in res["grads"].items():
            want = ref_grads[pname]
            label = f"{name}: gradient of layer {pname}"
            if got is None:
                fail(f"{label} is None: no gradient reached it", rank=r, hint="backward_step "
                     "must call backward on the saved output with the received gradient")
            c = _ratio(got, want)
            hint = SCALE if c is not None and abs(c - m) < 1e-6 else (
                f"it is {c:.4g} times the reference" if c is not None else
                "backpropagate the received gradient: output.backward(grad)")
            assert_close(got, want, name=label, rank=r, hint=hint, **TOL)
        if name == "1f1b" and res["peak"] > min(p - r, m):
            fail(f"1f1b: ctx.saved held {res['peak']} microbatches at once; 1F1B needs at most "
                 f"min(p - r, m) = {min(p - r, m)}", rank=r, hint="backward_step must remove "
                 "its microbatch from ctx.saved (ctx.saved.pop(mb)): 1F1B saves memory only "
                 "if each backward frees what its forward saved")


def check_p2p_step(forward_step: Callable, backward_step: Callable, *, world_size: int = 2,
                   timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 2: the learner's per-action steps under GPipe and 1F1B match one device."""
    not_reexport(forward_step, name="forward_step")
    not_reexport(backward_step, name="backward_step")
    m, names = 2 * world_size, ("gpipe", "1f1b")
    results = _run(_p2p_worker, world_size, forward_step, backward_step, m, names,
                   what="your forward_step and backward_step", timeout=timeout)
    for name in names:
        _compare([res[name] for res in results], name, m)
    if not quiet:
        print(f"forward_step and backward_step OK on {world_size} ranks under GPipe and 1F1B "
              f"(m = {m}): loss and every gradient equal the single-device run "
              f"(rtol {TOL['rtol']:g}); 1F1B peak per rank "
              f"{[res['1f1b']['peak'] for res in results]}")


# --- exercise 3: interleaved placement -----------------------------------------------------------

CONTIGUOUS = ("that is contiguous placement (rank r holds stages r v, ..., r v + v - 1): a "
              "microbatch then crosses ranks only p - 1 times and meets each rank's chunks "
              "back to back, so the bubble does not shrink. Looped placement gives rank r the "
              "stages r, r + p, r + 2p, ...")


def _layers_hint(got: Any, r: int, n: int, p: int, v: int) -> str:
    k = n // (p * v)
    contiguous = [list(range((r * v + c) * k, (r * v + c + 1) * k)) for c in range(v)]
    if got == contiguous:
        return CONTIGUOUS
    return (f"chunk c of rank r is stage s = c p + r, which holds the n_layers / (p v) = {k} "
            f"consecutive layers s*{k} ... s*{k} + {k - 1}; return one list per chunk, chunk 0 "
            "first")


def _placement_worker(schedule: Any, options: dict, layers_of: Callable) -> dict:
    from parlab.pp.run import pipeline_worker

    with refused([pp.stage_of], reference_message("parlab.pp.stage_of")):
        return pipeline_worker(schedule, None, options, layers_of)


def check_placement(stage_of: Callable, layers_of: Callable, *, world_size: int = 2,
                    timeout: float = CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 3: looped placement by formula, then an interleaved run on real ranks."""
    from parlab.pp.schedules import make_schedule

    not_reexport(stage_of, name="stage_of")
    not_reexport(layers_of, name="layers_of")
    for p, v in ((1, 2), (2, 2), (3, 2), (4, 2), (4, 3), (8, 4), (4, 1)):
        for r in range(p):
            for c in range(v):
                got = call(f"stage_of({r}, {c}, {p})", stage_of, r, c, p, refuse=(pp.stage_of,))
                if got != c * p + r:
                    fail(f"stage_of({r}, {c}, {p}) = {got!r} (v = {v}), expected c p + r = "
                         f"{c * p + r}", hint=CONTIGUOUS if got == r * v + c else
                         "chunk c of rank r is stage c p + r")
    for p, v, k in ((2, 2, 1), (2, 2, 2), (4, 2, 1), (3, 3, 2), (4, 1, 2), (1, 3, 1)):
        n = p * v * k
        for r in range(p):
            got = call(f"layers_of({r}, {n}, {p}, {v})", layers_of, r, n, p, v,
                       refuse=(pp.stage_of,))
            got = [list(x) for x in got] if isinstance(got, (list, tuple)) else got
            want = [list(range((c * p + r) * k, (c * p + r + 1) * k)) for c in range(v)]
            if got != want:
                fail(f"layers_of({r}, n_layers={n}, p={p}, v={v}) = {got}, expected {want}",
                     hint=_layers_hint(got, r, n, p, v))
    schedule = make_schedule("interleaved_1f1b", world_size, 2 * world_size, 2)
    results = _run(_placement_worker, world_size, schedule, OPTIONS, layers_of,
                   what="interleaved 1F1B with your layers_of", timeout=timeout)
    _compare([{"loss": res["loss"], "grads": res["grads"], "peak": 0} for res in results],
             "interleaved_1f1b", 2 * world_size)
    if not quiet:
        print(f"placement OK: stage_of and layers_of by formula; interleaved 1F1B (v = 2) on "
              f"{world_size} ranks with your split matches one device; point-to-point sends "
              f"per rank {[res['sends'] for res in results]}")
