r"""Module 08, exercise 3: the rows of the global batch each DP replica's stages see.

"Data parallel" means each replica trains on its own share of the global batch: d replicas,
B/d rows each, no row twice. Every replica on the whole batch gives the same losses (the mean
of d equal gradients is the whole batch's gradient) for d times the work, so the losses alone
cannot tell. In each rank of `check_train_3d`, `RowTap` records, between two optimizer steps:

- the token ids every embedding module looked up (the first stage's `nn.Embedding` or
  `VocabParallelEmbedding`): which rows of the batch this replica's first stage ran;
- the rows every pipeline stage module (`parlab.compose.Stage`) ran forward, counted.

`judge_rows` compares them, in the kernel, with the batch of each step (`parlab.model.batch`,
computed here): each replica's first stage B/d rows of it, the replicas' rows together the
batch, each row once; every stage of every rank B/d rows. A rank whose modules recorded
nothing (an answer that builds its model another way) is not judged on it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from parlab.check._compare import fail

__all__ = ["RowTap", "judge_rows", "WHOLE_BATCH"]

WHOLE_BATCH = ("every replica ran the whole batch: the loss is right (the mean of d equal "
               "gradients is the whole batch's gradient) and each replica does d times the "
               "work. Each replica runs its own rows only, x[grid.batch_rows("
               "plan.global_batch_size)], and the mean over grid.dp adds the shares up")


class RowTap:
    """While open (`install`), what this rank's modules were given, step by step (a step ends
    at each optimizer step: `step_done`)."""

    def __init__(self) -> None:
        self.step = 0
        self.ids: dict[int, list[torch.Tensor]] = {}  # step -> token ids embedded, (b, n) each
        self.rows: dict[int, dict[int, int]] = {}  # step -> {id of a Stage: rows run forward}
        self._handle: Any = None

    def _seen(self, module: nn.Module, args: tuple) -> None:
        from parlab.compose.stage import Stage
        from parlab.tp.vocab import VocabParallelEmbedding

        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        if isinstance(module, (nn.Embedding, VocabParallelEmbedding)) and not x.is_floating_point():
            self.ids.setdefault(self.step, []).append(x.detach().cpu().reshape(-1, x.shape[-1]))
        if isinstance(module, Stage):
            counts = self.rows.setdefault(self.step, {})
            counts[id(module)] = counts.get(id(module), 0) + int(x.shape[0])

    def install(self) -> None:
        self._handle = nn.modules.module.register_module_forward_pre_hook(self._seen)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()

    def step_done(self, *_: Any) -> None:
        self.step += 1

    def result(self) -> dict:
        return {"ids": {s: torch.cat(v) for s, v in self.ids.items()}, "rows": self.rows}


def judge_rows(results: list[dict], plan: Any, cfg: Any, steps: int) -> None:
    """Each replica's first stage ran its own B/d rows of each step's batch, the replicas
    together every row once; every stage of every rank B/d rows."""
    from parlab.model import batch, load_corpus

    tokens, share = load_corpus()[0], plan.global_batch_size // plan.dp
    for step in range(steps):
        x, _ = batch(tokens, step, batch_size=plan.global_batch_size, seq=cfg.seq,
                     seed=cfg.seed)
        where: dict[tuple[int, ...], list[int]] = {}
        for i, row in enumerate(x.tolist()):
            where.setdefault(tuple(row), []).append(i)
        firsts = {}  # dp coordinate -> the rows its first stage embedded (one rank of it)
        for r in results:
            ids = r["taps"]["ids"].get(step)
            if r["coords"]["pp"] == 0 and r["coords"]["tp"] == 0 and ids is not None:
                firsts[r["coords"]["dp"]] = ids
        if len(firsts) == plan.dp:
            _judge_shares(firsts, where, x.shape[0], share, plan, step, results)
        for rank, r in enumerate(results):
            for n in r["taps"]["rows"].get(step, {}).values():
                if n != share:
                    fail(f"step {step}: a pipeline stage of this rank ran {n} rows forward; a "
                         f"replica's share of the global batch of "
                         f"{plan.global_batch_size} rows over DP {plan.dp} is {share}",
                         rank=rank, hint=WHOLE_BATCH if n == plan.global_batch_size else
                         "run every micro-batch of this replica's rows through the schedule "
                         "once: plan.global_batch_size / dp rows, in micro-batches of "
                         "plan.micro_batch_size")


def _judge_shares(firsts: dict[int, torch.Tensor], where: dict, batch_rows: int, share: int,
                  plan: Any, step: int, results: list[dict]) -> None:
    rank_of = {r["coords"]["dp"]: k for k, r in enumerate(results)
               if r["coords"]["pp"] == 0 and r["coords"]["tp"] == 0}
    left = {row: list(places) for row, places in where.items()}  # rows of the batch not run
    twice: list[int] = []
    for dp, ids in sorted(firsts.items()):
        rows = [tuple(row) for row in ids.tolist()]
        if any(row not in where for row in rows):
            fail(f"step {step}: replica {dp}'s first stage embedded token ids that are no row of "
                 f"step {step}'s global batch", rank=rank_of[dp],
                 hint="take step s's rows from batch(tokens, s, batch_size=plan."
                      "global_batch_size, ...), the same on every rank, then this replica's "
                      "share x[grid.batch_rows(plan.global_batch_size)]")
        if len(rows) == batch_rows and plan.dp > 1:
            fail(f"step {step}: replica {dp}'s first stage embedded all {batch_rows} rows of the "
                 f"global batch; its share over DP {plan.dp} is {share}", rank=rank_of[dp],
                 hint=WHOLE_BATCH)
        for row in rows:
            if left[row]:
                left[row].pop(0)
            else:
                twice.append(where[row][0])
    missing = sorted(i for places in left.values() for i in places)
    if twice or missing:
        fail(f"step {step}: the replicas' first stages embedded "
             + (f"row {twice[0]} of the global batch more than once" if twice else
                f"none of rows {missing} of the global batch"), rank=rank_of[min(firsts)],
             hint="each replica runs its own rows, x[grid.batch_rows(plan.global_batch_size)], "
                  "so that together they run every row of the batch once")
