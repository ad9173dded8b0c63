"""Module 08 under torchrun: train the tiny Llama on DP × PP × TP (+SP) × CP × EP ranks.

The arguments are Megatron-LM's (`pretrain_gpt.py`), so a line that works here is the line
to type there; DP is what the world size leaves: world / (TP · PP · CP), and EP divides it.
One node, 8 processes (CPU with gloo, or 8 GPUs with NCCL):

    torchrun --standalone --nproc-per-node 8 scripts/train.py \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \\
        --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --check

Two nodes (run the same line on both; HOST is the first node's address, or 127.0.0.1 for two
"nodes" on one machine, as tests/test_train_script.py does):

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id llama scripts/train.py --tensor-model-parallel-size 2 \\
        --pipeline-model-parallel-size 2 --sequence-parallel --train-iters 20 --check

More: --num-layers-per-virtual-pipeline-stage 1 (interleaved 1F1B), --context-parallel-size 2
(ring attention), --num-experts 4 --expert-model-parallel-size 2 (the MoE variant),
--use-distributed-optimizer (ZeRO-1: Adam's moments sharded over the data-parallel ranks).

Checkpoints (module 09), Megatron's names: --save DIR --save-interval N writes a distributed
checkpoint (torch.distributed.checkpoint) every N iterations and after the last; --load DIR
resumes from the latest one (or --ckpt-step N's), on any grid of the same model: stop a run
on 8 ranks and go on with 4, or with 1. Under torchrun --max-restarts K, give --save and
--load the same DIR: when a rank dies, torchrun starts every process again, they load the
last checkpoint, and rank 0 says which iterations were lost and are run again.

    torchrun --standalone --nproc-per-node 4 --max-restarts 2 scripts/train.py \
        --tensor-model-parallel-size 2 --train-iters 40 --save ckpt --save-interval 5 \
        --load ckpt

Options that do not fit the world size or the model (TP 4 with 2 KV heads) end every process
with exit status 2 before any process group starts, rank 0 alone saying why
(`parlab.launch.torchrun`). The training code is `parlab.compose.train`, the same the notebook
and tests run through `parlab.launch.run`. NCCL when there is a GPU for every process of the
node, gloo otherwise.
SIGUSR1 (Slurm's warning before a job's time limit: scripts/train.sbatch) stops every rank
at the next iteration boundary, after a checkpoint there when --save is given, and exits 0;
--load of the same folder goes on from it, with the losses of a run that never stopped.
Rank 0 draws a progress bar (tokens/s and the loss; one line per iteration when the output is
not a terminal). --check also trains the model on one device and exits 1 when a loss of the
first `CHECKED_STEPS` iterations differs by more than `parlab.compose.TOLERANCE` (on a
resumed run: the iterations it ran, against the single device's same iterations). --trace
PATH profiles every rank (`parlab.timeline.profiled`, CUDA kernels included under NCCL) and
rank 0 writes one merged Chrome trace there, one row per rank, for Perfetto.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from parlab import launch, timeline
from parlab.compose import (
    CHECKED_STEPS,
    TOLERANCE,
    Plan,
    check_plan,
    train,
    train_single,
)
from parlab.compose.resume import Checkpoints
from parlab.compose.train import Position, Replica
from parlab.launch import torchrun
from parlab.model import LlamaConfig

MEGATRON = "(Megatron-LM's names and meanings)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grid = p.add_argument_group("parallelism " + MEGATRON)
    grid.add_argument("--tensor-model-parallel-size", type=int, default=1)
    grid.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    grid.add_argument("--sequence-parallel", action="store_true")
    grid.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                      help="interleaved 1F1B with num-layers / (PP · this) chunks per rank")
    grid.add_argument("--context-parallel-size", type=int, default=1)
    grid.add_argument("--expert-model-parallel-size", type=int, default=1,
                      help="divides the data-parallel size (EP is folded into DP)")
    grid.add_argument("--micro-batch-size", type=int, default=2)
    grid.add_argument("--global-batch-size", type=int, default=8)
    grid.add_argument("--train-iters", type=int, default=10)
    model = p.add_argument_group("model and optimizer " + MEGATRON)
    model.add_argument("--num-layers", type=int, default=LlamaConfig.layers)
    model.add_argument("--hidden-size", type=int, default=LlamaConfig.hidden)
    model.add_argument("--num-attention-heads", type=int, default=LlamaConfig.heads)
    model.add_argument("--group-query-attention", action="store_true",
                       help="accepted for Megatron; here --num-query-groups always applies")
    model.add_argument("--num-query-groups", type=int, default=LlamaConfig.kv_heads)
    model.add_argument("--ffn-hidden-size", type=int, default=LlamaConfig.ffn)
    model.add_argument("--seq-length", type=int, default=LlamaConfig.seq)
    model.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    model.add_argument("--num-experts", type=int, default=None, help="MoE layers when given")
    model.add_argument("--moe-layer-freq", type=int, default=1,
                       help="layer i is a MoE layer when i %% freq == 0")
    model.add_argument("--moe-router-topk", type=int, default=LlamaConfig.top_k)
    model.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    model.add_argument("--lr", type=float, default=3e-3)
    model.add_argument("--seed", type=int, default=LlamaConfig.seed)
    model.add_argument("--use-distributed-optimizer", action="store_true",
                       help="ZeRO-1: Adam's state sharded over the data-parallel ranks")
    ckpt = p.add_argument_group("checkpoints " + MEGATRON)
    ckpt.add_argument("--save", default=None, help="directory to save checkpoints to")
    ckpt.add_argument("--save-interval", type=int, default=None,
                      help="save every N iterations (and after the last)")
    ckpt.add_argument("--load", default=None,
                      help="directory to resume from (its latest checkpoint); none there: "
                      "start from iteration 0")
    ckpt.add_argument("--ckpt-step", type=int, default=None,
                      help="load this iteration's checkpoint instead of the latest")
    ours = p.add_argument_group("this course's own")
    ours.add_argument("--cp-layout", default="zigzag", choices=["contiguous", "zigzag"],
                      help="the positions a CP rank holds (Megatron: zigzag)")
    ours.add_argument("--trace", metavar="PATH", default=None,
                      help="profile every rank; rank 0 writes one merged Chrome trace to PATH")
    ours.add_argument("--check", action="store_true",
                      help="also train on one device; exit 1 if a loss differs > TOLERANCE")
    return p


def plan_from_args(args: argparse.Namespace, world_size: int) -> tuple[LlamaConfig, Plan]:
    """The model and the grid these arguments ask for on `world_size` ranks."""
    tp, pp, cp = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                  args.context_parallel_size)
    dp, left = divmod(world_size, tp * pp * cp)
    ep = args.expert_model_parallel_size
    if left or dp == 0 or dp % ep:
        raise ValueError(f"{world_size} ranks do not split into TP {tp} × PP {pp} × CP {cp} "
                         f"× DP (a multiple of EP {ep}): DP is what the world size leaves")
    v = 1
    if args.num_layers_per_virtual_pipeline_stage:
        v, left = divmod(args.num_layers // pp, args.num_layers_per_virtual_pipeline_stage)
        if left or args.num_layers % pp:
            raise ValueError("--num-layers must be PP × chunks × "
                             "--num-layers-per-virtual-pipeline-stage")
    moe = () if args.num_experts is None else tuple(
        i for i in range(args.num_layers) if i % args.moe_layer_freq == 0)
    cfg = LlamaConfig(layers=args.num_layers, hidden=args.hidden_size,
                      heads=args.num_attention_heads, kv_heads=args.num_query_groups,
                      ffn=args.ffn_hidden_size, seq=args.seq_length,
                      tied=not args.untie_embeddings_and_output_weights, moe_layers=moe,
                      experts=args.num_experts or LlamaConfig.experts, top_k=args.moe_router_topk,
                      capacity_factor=args.moe_expert_capacity_factor, seed=args.seed)
    plan = Plan(dp=dp // ep, pp=pp, tp=tp, cp=cp, ep=ep, sequence_parallel=args.sequence_parallel,
                virtual=v, schedule="interleaved_1f1b" if v > 1 else "1f1b",
                micro_batch_size=args.micro_batch_size,
                global_batch_size=args.global_batch_size, layout=args.cp_layout,
                distributed_optimizer=args.use_distributed_optimizer)
    check_plan(cfg, plan, world_size=world_size)
    return cfg, plan


def progress(total: int, tokens_per_step: int):
    """on_step for `train`: rank 0 draws the bar with tokens/s and the loss."""
    tty = sys.stdout.isatty()

    def on_step(step: int, loss: float, seconds: float) -> None:
        if dist.get_rank() != 0:
            return
        done = round(20 * (step + 1) / total)
        line = (f"iteration {step + 1:4d}/{total} |{'█' * done}{'░' * (20 - done)}| "
                f"loss {loss:.6f} | {tokens_per_step / seconds:,.0f} tokens/s")
        print("\r" + line if tty else line, end="" if tty and step + 1 < total else "\n",
              flush=True)
    return on_step


def check(cfg: LlamaConfig, plan: Plan, losses: list[float], lr: float, first: int = 0) -> int:
    """Rank 0: the single-device run beside this one (its iterations first+1.. when this
    run resumed at `first`); the exit status."""
    single = train_single(cfg, first + len(losses), global_batch_size=plan.global_batch_size,
                          lr=lr, device=launch.device())[first:]
    gaps = [abs(a - b) for a, b in zip(single, losses, strict=True)]
    checked = max(0, min(len(gaps), CHECKED_STEPS - first))
    worst = max(gaps[:checked], default=0.0)
    ok = worst <= TOLERANCE
    which = (f"the first {checked} iterations" if not first else
             f"iterations {first + 1}-{first + checked} (resumed after {first})")
    print(f"check: largest |single - parallel| = {worst:.1e} over {which}, tolerance "
          f"{TOLERANCE:.0e}: {'OK' if ok else 'FAILED'}")
    if len(gaps) > checked:
        print(f"(after iteration {CHECKED_STEPS} rounding differences grow, not checked: "
              f"largest {max(gaps[checked:]):.1e})")
    return 0 if ok else 1


def report_restart() -> None:
    """Rank 0, at start: which restart this is of how many torchrun allows."""
    count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    most = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if count == 0 or dist.get_rank() != 0:
        return
    last = (": the last one torchrun allows, a further failure ends the run" if count >= most
            else "")
    print(f"restart {count} of {most} (torchrun --max-restarts){last}", flush=True)


def _attempt_store(timeout: timedelta) -> dist.Store | None:
    """Under torchrun, the store of this attempt: torchrun's own (hosted by its agent), its
    keys prefixed by the restart count. A restarted group on the unprefixed store can read
    the addresses the dead attempt's processes left there and fail to connect (measured:
    "Gloo connectFullMesh failed ... Connection refused" after every restart)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/parlab/attempt_{attempt}", store)


def init_distributed() -> None:
    """NCCL when there is a GPU for every process on this node, gloo otherwise (the course's
    one rule: parlab.launch.pick_backend, PARLAB_BACKEND and PARLAB_GPUS included)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend, timeout = launch.pick_backend(local), timedelta(minutes=5)
    launch.devices.pin_numerics()
    store = _attempt_store(timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)


class Stopped(Exception):
    """Every rank, at the iteration boundary after a SIGUSR1 (its checkpoint saved)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped after iteration {step}")
        self.step = step


class SignalNote:
    """Notes that `sig` arrived, instead of its default action (SIGUSR1's ends the process)."""

    def __init__(self, sig: signal.Signals) -> None:
        self.seen = False
        signal.signal(sig, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.seen = True


class StopOnSignal:
    """`train`'s checkpointer, stopping once `note` has seen its signal: after each iteration
    the ranks take the MAX of their notes (the signal reaches each process at its own moment,
    and all must stop after the same iteration); if one was signalled, every rank saves there
    (as after the last iteration) and raises `Stopped`."""

    def __init__(self, checkpoints: Checkpoints, note: SignalNote) -> None:
        self.checkpoints, self.note = checkpoints, note

    def resume(self, rep: Replica) -> Position:
        return self.checkpoints.resume(rep)

    def after_step(self, rep: Replica, position: Position, *, last: bool) -> None:
        flag = torch.tensor([float(self.note.seen)], device=rep.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one float per iteration
        stop = flag.item() > 0 and not last
        self.checkpoints.after_step(rep, position, last=last or stop)
        if stop:
            raise Stopped(position.step)


@contextlib.contextmanager
def traced(path: str | None) -> Iterator[None]:
    """--trace PATH: each rank profiled into its own file; after the run the files travel to
    rank 0 (gather_object: the ranks may sit on different nodes), which merges them."""
    if path is None:
        yield
        return
    rank = dist.get_rank()
    with tempfile.TemporaryDirectory(prefix="parlab-trace-") as tmp:
        part = Path(tmp) / f"rank{rank}.json"
        with timeline.profiled(part, cuda=launch.uses_nccl()):
            yield
        parts: list[str | None] | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(part.read_text(), parts, dst=0)
        if parts is not None:
            files = [Path(tmp) / f"part{r}.json" for r in range(len(parts))]
            for file, text in zip(files, parts, strict=True):
                file.write_text(text or "")
            timeline.merge(files, path)
            print(f"trace of {len(files)} ranks: {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    options = parser()
    usr1 = SignalNote(signal.SIGUSR1)  # first: from here on SIGUSR1 stops where it can save
    args = options.parse_args(argv)
    # Options that do not fit end every process before any group starts, rank 0 saying why.
    cfg, plan = torchrun.fits_or_exit(options, lambda: plan_from_args(args, torchrun.world_size()))
    init_distributed()
    # An exception from here on ends this process without a barrier: the others may be inside
    # a collective it never joins; they fail when its connections close, and torchrun restarts
    # the group.
    if dist.get_rank() == 0:
        nodes = dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        axes = " × ".join(f"{a} {n}" for a, n in (("DP", plan.dp * plan.ep), (
            "PP", plan.pp), ("TP", plan.tp), ("CP", plan.cp), ("EP", plan.ep)) if n > 1)
        print(f"{dist.get_backend()}, {dist.get_world_size()} ranks on {nodes} node(s): "
              f"{axes or 'one rank'}{' with SP' if plan.sequence_parallel else ''}"
              f"{' with ZeRO-1' if plan.distributed_optimizer else ''}, "
              f"{plan.schedule}, {args.train_iters} iterations", flush=True)
    report_restart()
    ckpt = Checkpoints(save=args.save, interval=args.save_interval, load=args.load,
                       step=args.ckpt_step, log=lambda line: print(line, flush=True))
    start = time.perf_counter()
    bar = progress(args.train_iters, plan.global_batch_size * cfg.seq)
    try:
        with traced(args.trace):
            losses = train(cfg, plan, args.train_iters, lr=args.lr,
                           checkpoints=StopOnSignal(ckpt, usr1), on_step=bar)
    except Stopped as stop:
        if dist.get_rank() == 0:
            saved = (f"saved; --load {args.save} goes on from there" if args.save else
                     "nothing saved (no --save)")
            print(f"SIGUSR1: stopped after iteration {stop.step} of {args.train_iters}, "
                  f"{saved}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    status = 0
    if dist.get_rank() == 0:
        print(f"trained in {time.perf_counter() - start:.1f} s", flush=True)
        first = ckpt.resumed.position.step if ckpt.resumed else 0
        resumed_data = ckpt.resumed.position.consumed_samples if ckpt.resumed else 0
        if args.check and resumed_data != first * plan.global_batch_size:
            print("check: skipped, the run resumed at another data position than the "
                  "single device's (another --global-batch-size)")
        elif args.check:
            status = check(cfg, plan, losses, args.lr, first)
    dist.barrier()  # destroy right after the last collective can abort (NOTES.md)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
