r"""Roofline arithmetic for the GPU check (scripts/gpu_check.py): from measured seconds to
FLOP/s, bytes/s and module 00's FLOP-per-byte threshold, and the check's summary table.

Work counted per kernel:

- a matmul $(n \times k)(k \times m)$ does $2nkm$ FLOPs, one multiply and one add per term;
- a device-to-device copy of N bytes within one GPU reads N and writes N: $2N$ bytes go
  through its memory; a copy from one GPU to another moves N bytes over the link between them.

A rate is work / seconds. The roofline's ridge, $F/\beta$ for a device of F FLOP/s and memory
bandwidth β, is the arithmetic intensity a kernel needs to be compute-bound. It is the same
number module 00 asks of a link (`parlab.costs.required_flops_per_byte`): with β a link's
bytes/s, a strategy whose FLOPs per byte communicated fall below it waits on the link
(`parlab.costs.comm_verdict`). Module 00's examples are tensor parallelism at hidden size
H = 8192 ($\approx H$ FLOP/B) and data parallelism at $N_{tok} = 4\cdot10^6$ tokens per step
($3N_{tok}$); the check puts them against the measured card.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.costs.closed_forms import (
    comm_verdict,
    dp_flops_per_byte,
    required_flops_per_byte,
    tp_flops_per_byte,
)

__all__ = ["Timing", "matmul_flops", "copy_bytes", "format_rate", "timing_row", "roofline_rows",
           "module_verdicts",
           "link_rows", "summary_table", "TP_HIDDEN", "DP_TOKENS"]

TP_HIDDEN = 8192  # module 00's hidden size
DP_TOKENS = 4e6  # module 00's tokens per step, per replica

Row = tuple[str, str, str, str]  # (part, item, result, seconds)


@dataclass(frozen=True)
class Timing:
    """One measured kernel: a label, the work it does (FLOPs or bytes), its median seconds."""

    label: str
    work: float
    seconds: float
    unit: str  # "FLOP/s" or "B/s"

    @property
    def rate(self) -> float:
        if self.seconds <= 0:
            raise ValueError(f"{self.label}: a time must be > 0 s, got {self.seconds}")
        return self.work / self.seconds


def matmul_flops(n: int, k: int | None = None, m: int | None = None) -> float:
    """FLOPs of an (n, k) @ (k, m) matmul: 2 n k m (k and m default to n, a square one)."""
    k, m = k or n, m or n
    return 2.0 * n * k * m


def copy_bytes(nbytes: float, *, same_device: bool = True) -> float:
    """Bytes a copy of `nbytes` moves: read + write (2N) within one GPU's memory, N on a link."""
    return 2.0 * nbytes if same_device else float(nbytes)


def format_rate(rate: float, unit: str) -> str:
    """SI with three significant digits: 4.21 TB/s, 989 TFLOP/s, 12.5 GB/s."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.3g} {prefix}{unit}"
    return f"{rate:.3g} {unit}"


def timing_row(timing: Timing) -> Row:
    return ("roofline", timing.label, format_rate(timing.rate, timing.unit),
            f"{timing.seconds:.3g}")


def roofline_rows(matmuls: list[Timing], copy: Timing) -> tuple[list[Row], float]:
    """A row per measured kernel and one for the ridge; returns (rows, peak FLOP/s), the peak
    being the fastest matmul measured (bf16 on any recent card)."""
    rows = [timing_row(t) for t in [*matmuls, copy]]
    peak = max(t.rate for t in matmuls)
    ridge = required_flops_per_byte(peak, copy.rate)
    rows.append(("roofline", "ridge: peak matmul FLOP/s / memory bytes/s",
                 f"{ridge:,.0f} FLOP/B", ""))
    return rows, peak


def link_rows(peak: float, links: dict[str, float]) -> list[Row]:
    """Module 00's threshold per link at the measured peak, with its verdicts for TP and DP."""
    tp, dp = tp_flops_per_byte(TP_HIDDEN), dp_flops_per_byte(DP_TOKENS)
    rows = []
    for name, bandwidth in links.items():
        need = required_flops_per_byte(peak, bandwidth)
        rows.append(("threshold", f"{name}, {format_rate(bandwidth, 'B/s')}",
                     f"{need:,.0f} FLOP/B needed; TP (H={TP_HIDDEN}, {tp:,.0f} FLOP/B): "
                     f"{comm_verdict(tp, peak, bandwidth)}; DP (N_tok={DP_TOKENS:.0e}, "
                     f"{dp:.2g} FLOP/B): {comm_verdict(dp, peak, bandwidth)}", ""))
    return rows


def summary_table(rows: list[Row]) -> str:
    """The check's one markdown table: part, item, result, seconds."""
    lines = ["| part | item | result | s |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def module_verdicts(rows: list[Row], modules: list[str]) -> str:
    """One line per module over every part of the check (rows whose item starts with the
    module's name): passed, FAILED with its first error, or SKIPPED with why."""
    verdicts: dict[str, str] = {}
    for _, item, result, _ in rows:
        module = str(item).split(" ")[0]
        if module not in modules:
            continue
        now = verdicts.setdefault(module, "passed")
        if result.startswith("FAIL") and not now.startswith("FAILED"):
            verdicts[module] = "FAILED: " + result.removeprefix("FAIL").strip(" :")[:160]
        elif result.startswith("SKIPPED") and now == "passed":
            verdicts[module] = "SKIPPED: " + result.removeprefix("SKIPPED").strip(" :")
    return "\n".join(["| module | verdict |", "|---|---|"]
                     + [f"| {m} | {verdicts.get(m, 'SKIPPED: not reached')} |" for m in modules])
