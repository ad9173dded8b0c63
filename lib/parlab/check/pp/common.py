r"""What module 04's rank checks share: sizes, the single-device reference, the comparison.

Sizes no answer can special-case: the toy model (`parlab.pp.executor`, Linear + tanh layers
of width 16 in float64) has 3 layers per stage, so n_layers = 3 p v (6, 9, 12, ... for
p = 2, 3, 4); exercise 2 runs m = 2p + 1 microbatches (5, 7, 9) of 3 rows, so m equals neither
the rows of a microbatch nor p; interleaved 1F1B needs m to be a multiple of p and runs
m = 3p microbatches of 2 rows.

The reference is the same seeded model on one device, full batch, mean-squared-error loss;
in float64 the pipeline differs from it only by the order of the additions (~1e-16), so loss
and gradients are compared at rtol 1e-9, atol 1e-12.

`P2PGuard` is a `parlab.comm` listener that looks at every point-to-point call of the
learner's code *before* it is made: gloo cannot exchange tensors of different sizes (the
receiving process aborts, and its peer then reads "Connection reset by peer"), so a buffer of
the wrong dtype or shape is reported here, by name, instead.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from parlab.check import assert_close, fail

__all__ = ["TOL", "options", "reference", "compare", "P2PGuard", "SCALE", "BLOCKING", "HANG"]

TOL = {"rtol": 1e-9, "atol": 1e-12}
WIDTH = 16
SCALE = ("scale each microbatch's loss by 1/m: the full batch's loss is the mean of the m "
         "microbatch losses, so without 1/m the loss and every gradient come out m times too big")
BLOCKING = ("dist.send waits until the peer has received: under 1F1B rank r sends an "
            "activation forward while rank r + 1 sends it a gradient back, and both wait "
            "forever. Send with dist.isend and append its handle to ctx.sends (they are waited "
            "on at the end)")
HANG = ("a recv whose message is never sent (the peer's step lacks its isend, or sends to "
        "another rank), or a message received by the wrong rank")


def options(p: int, *, v: int = 1) -> dict[str, Any]:
    """The executor's sizes for p ranks and v chunks each (see the module docstring)."""
    m = 2 * p + 1 if v == 1 else 3 * p
    rows = 3 if v == 1 else 2
    return {"n_layers": 3 * p * v, "width": WIDTH, "batch": rows * m, "seed": 0, "m": m}


def model_options(opts: dict[str, Any]) -> dict[str, Any]:
    """`opts` without "m": the keyword arguments of `parlab.pp.make_context`."""
    return {k: val for k, val in opts.items() if k != "m"}


@functools.lru_cache(maxsize=8)
def _reference(n_layers: int, width: int, batch: int, seed: int
               ) -> tuple[float, dict[str, torch.Tensor]]:
    from parlab.pp.model import make_data, make_model
    from parlab.pp.model import reference as single_device

    model = make_model(n_layers, width, seed=seed)
    return single_device(model, *make_data(batch, width, seed=seed))


def reference(opts: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    """The single-device loss and gradients for these sizes."""
    return _reference(opts["n_layers"], opts["width"], opts["batch"], opts["seed"])


def _ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    c = float((got * want).sum() / (want * want).sum())
    close = torch.allclose(got, c * want, rtol=TOL["rtol"], atol=TOL["atol"])
    return c if close else None


def _loss_hint(c: float, m: int, rows: int) -> str:
    if abs(c - m) < 1e-6:
        return SCALE
    if abs(c - m / rows) < 1e-6:
        return (f"divide by ctx.m = {m}, the number of microbatches, not by {rows}, the rows "
                "of one microbatch (ctx.shape[0]): the full batch's loss is the mean of the "
                "m microbatch losses")
    return "loss_i = ctx.loss_fn(output, ctx.targets[mb]) / ctx.m on the last stage"


def compare(results: list[dict], name: str, opts: dict[str, Any],
            peaks: list[float] | None = None, *, loss_rank: int | None = None) -> None:
    """Loss and every gradient against one device; with `peaks`, the activations held.
    `loss_rank`: the rank of the last stage (default p - 1; 0 under the V placement)."""
    ref_loss, ref_grads = reference(opts)
    p, m, rows = len(results), opts["m"], opts["batch"] // opts["m"]
    last = p - 1 if loss_rank is None else loss_rank
    loss = results[last]["loss"]
    if loss is None:
        fail(f"{name}: the last stage recorded no loss", rank=last, hint="forward_step on "
             "the last stage appends this microbatch's loss / m (detached) to ctx.losses")
    if abs(loss - ref_loss) > TOL["rtol"] * abs(ref_loss):
        c = loss / ref_loss
        fail(f"{name} (p = {p}, m = {m}): the microbatch losses add up to {loss:.10g}, the "
             f"full batch's is {ref_loss:.10g} ({c:.4g} times)", rank=last,
             hint=_loss_hint(c, m, rows))
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
        if peaks is not None and res["peak"] > peaks[r]:
            fail(f"{name}: ctx.saved held {res['peak']} microbatches at once; this schedule "
                 f"needs at most {peaks[r]:g} on rank {r}", rank=r, hint="backward_step must "
                 "remove its microbatch from ctx.saved (ctx.saved.pop(mb)): 1F1B saves memory "
                 "only if each backward frees what its forward saved")


_P2P = ("send", "recv", "isend", "irecv")


class P2PGuard:
    """A `parlab.comm` listener, open around one learner call in a rank: before each of its
    point-to-point calls is made, the tensor must have `shape` and `dtype`, and a send must
    not be the blocking `dist.send` (when `blocking_send` says so)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, *, rank: int,
                 where: str, what: str, buffer_hint: str,
                 blocking_send: str | None = None) -> None:
        self.shape, self.dtype = tuple(shape), str(dtype).replace("torch.", "")
        self.rank, self.where, self.what = rank, where, what
        self.buffer_hint, self.blocking_send = buffer_hint, blocking_send

    def __call__(self, phase: str, event: Any) -> None:
        if phase != "start" or event.kind not in _P2P:
            return
        if event.kind == "send" and self.blocking_send:
            fail(f"{self.where} sent with a blocking dist.send", rank=self.rank,
                 hint=self.blocking_send)
        if (event.dtype, tuple(event.shape)) != (self.dtype, self.shape):
            peer = list(event.group_ranks)
            fail(f"{self.where} called dist.{event.kind} with rank {peer} on a {event.dtype} "
                 f"tensor of shape {tuple(event.shape)}, but {self.what} are {self.dtype} of "
                 f"shape {self.shape}. Stopped before the exchange: gloo cannot match tensors "
                 "of different sizes (the receiving process aborts and its peer reads "
                 "'Connection reset by peer')", rank=self.rank, hint=self.buffer_hint)

    def __enter__(self) -> P2PGuard:
        from parlab import comm

        comm.add_listener(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from parlab import comm

        comm.remove_listener(self)
