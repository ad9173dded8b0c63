"""Run the capstone from a notebook: dp·tp ranks, a progress bar, and the two loss curves.

    from parlab.capstone import TOLERANCE, plot_losses, run_capstone, train_single

    parallel = run_capstone(GPTConfig(), 30, dp=2, tp=2)    # a progress bar while it trains
    single = train_single(GPTConfig(), 30, batch_size=8, lr=3e-3)
    plot_losses(single, parallel, tol=TOLERANCE)

`run_capstone` starts dp·tp ranks with `parlab.launch.run` (gloo on CPU, NCCL when there is
a GPU per rank) and runs `fn` on each; `fn` is `parlab.capstone.train_parallel` or a
learner's own function with its signature. Rank 0 appends one line per step to a progress
file; in a notebook kernel a daemon thread polls that file and moves an ipywidgets bar.
Outside a kernel (a script, pytest) nothing extra is shown.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from parlab import launch
from parlab.capstone.train import check_plan, train_parallel
from parlab.model.gpt import GPTConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # pyplot is imported where it draws: ranks never do

__all__ = ["run_capstone", "plot_losses", "read_progress"]

POLL_S = 0.2  # how often the progress thread reads the file


def run_capstone(cfg: GPTConfig | None = None, steps: int = 30, *, dp: int = 2, tp: int = 2,
                 batch_size: int = 8, lr: float = 3e-3, fn: Callable = train_parallel,
                 timeout: float = 300.0, **fn_kwargs: Any) -> list[float]:
    """Train with `fn` on dp·tp ranks; the loss of every step (rank 0's, checked equal on all).

    `fn(cfg, steps, dp=, tp=, batch_size=, lr=, progress_file=, **fn_kwargs)` runs on every
    rank; `timeout` bounds the whole run (a hang raises `parlab.launch.CollectiveTimeout`).
    """
    cfg = cfg or GPTConfig()
    check_plan(cfg, dp=dp, tp=tp, batch_size=batch_size)  # fail here, not on four ranks
    with tempfile.TemporaryDirectory(prefix="parlab-capstone-") as tmp:
        path = os.path.join(tmp, "progress.txt")
        with _progress_bar(path, steps):
            results = launch.run(fn, dp * tp, cfg, steps, dp=dp, tp=tp, batch_size=batch_size,
                                 lr=lr, progress_file=path, timeout=timeout, **fn_kwargs)
    for rank, losses in enumerate(results):
        if list(losses) != list(results[0]):
            raise ValueError(f"rank {rank} returned other losses than rank 0: every rank must "
                             "return the global mean loss (average the loss over the DP group)")
    return list(results[0])


def read_progress(path: str, offset: int = 0) -> tuple[list[tuple[int, float]], int]:
    """The complete "<step> <loss>" lines after byte `offset`, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for next time
    rows = [(int(s), float(v)) for s, v in (line.split() for line in complete.splitlines())]
    return rows, offset + len(complete)


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), never in a script."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


@contextlib.contextmanager
def _progress_bar(path: str, steps: int) -> Iterator[None]:
    """Show a bar that follows `path` while the body runs (only in a notebook kernel)."""
    if not _in_kernel():
        yield
        return
    from IPython.display import display
    from ipywidgets import HBox, IntProgress, Label

    bar = IntProgress(value=0, min=0, max=max(steps, 1), description="training")
    label = Label(f"0/{steps} steps")
    display(HBox([bar, label]))
    stop = threading.Event()

    def follow() -> None:
        offset = 0
        while True:
            done = stop.wait(POLL_S)  # read once more after the run ends
            rows, offset = read_progress(path, offset)
            if rows:
                step, loss = rows[-1]
                bar.value = step + 1
                label.value = f"{step + 1}/{steps} steps, loss {loss:.4f}"
            if done:
                return

    thread = threading.Thread(target=follow, name="capstone-progress", daemon=True)
    thread.start()
    try:
        yield
        bar.bar_style = "success"
    except BaseException:
        bar.bar_style = "danger"
        raise
    finally:
        stop.set()
        thread.join()


def plot_losses(single: Sequence[float], parallel: Sequence[float], *, tol: float) -> Figure:
    """The two loss curves, and below them the per-step |difference| against `tol`."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if len(single) != len(parallel):
        raise ValueError(f"{len(single)} single-device losses but {len(parallel)} parallel "
                         "ones: train both for the same number of steps")
    steps = range(len(single))
    diff = [abs(a - b) for a, b in zip(single, parallel, strict=True)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True,
                                      height_ratios=(2, 1), layout="constrained")
    top.plot(steps, single, color="tab:blue", linewidth=2.5, label="single device")
    top.plot(steps, parallel, color="tab:orange", linestyle="--", marker=".",
             label="DP × TP ranks")
    top.set_ylabel("training loss (cross-entropy)")
    top.set_title("Tiny GPT: loss per step, one device vs DP × TP ranks")
    top.legend()
    bottom.semilogy(steps, [max(d, 1e-9) for d in diff], marker=".", color="tab:green",
                    label="|single - parallel| (0 drawn at 1e-9)")
    bottom.axhline(tol, color="tab:red", linestyle=":", label=f"tolerance {tol:g}")
    bottom.set_ylim(5e-10, max(tol, *diff) * 300)  # room for the legend above the line
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("step")
    bottom.set_ylabel("|difference|")
    bottom.legend(loc="upper left", fontsize="small")
    return fig
