"""Module 07 capstone under torchrun: train the tiny GPT with DP × TP, print the loss per step.

One node, 4 processes (CPU with gloo, or 4 GPUs with NCCL):

    torchrun --standalone --nproc-per-node 4 scripts/capstone.py --dp 2 --tp 2 --steps 30 --check

Two nodes of 8 GPUs (run the same line on both; HOST is the first node's address):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        scripts/capstone.py --dp 4 --tp 4 --heads 4 --batch-size 16 --steps 30 --check

dp × tp must equal the number of processes (nnodes × nproc-per-node). TP is innermost, so
with tp dividing nproc-per-node every TP group sits inside one node and only the DP all-reduce
crosses nodes. The backend is NCCL when CUDA is there with a GPU for every local process,
gloo otherwise. Rank 0 prints one line per step; with --check it also trains the same model
on one device and exits 1 if any step's loss differs by more than
`parlab.capstone.TOLERANCE`.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch.distributed as dist

from parlab.capstone import TOLERANCE, check_plan, train_parallel, train_single
from parlab.launch import device, devices, torchrun
from parlab.model import GPT, GPTConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dp", type=int, default=2, help="data-parallel size")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (divides --heads)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8, help="global batch (divisible by --dp)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--layers", type=int, default=GPTConfig.layers)
    p.add_argument("--hidden", type=int, default=GPTConfig.hidden)
    p.add_argument("--heads", type=int, default=GPTConfig.heads)
    p.add_argument("--seed", type=int, default=GPTConfig.seed)
    p.add_argument("--check", action="store_true",
                   help="also train on one device; exit 1 if a step differs by > TOLERANCE")
    return p


def model_from_args(args: argparse.Namespace, world_size: int) -> GPTConfig:
    """The model these arguments ask for, checked against the grid on `world_size` ranks."""
    cfg = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seed=args.seed)
    check_plan(cfg, dp=args.dp, tp=args.tp, batch_size=args.batch_size, world_size=world_size)
    GPT(cfg)  # what the configuration itself refuses (hidden not divisible by heads)
    return cfg


def init_distributed() -> None:
    """NCCL when there is a GPU for every process on this node, gloo otherwise (the course's
    one rule: parlab.launch.pick_backend, PARLAB_BACKEND and PARLAB_GPUS included)."""
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    devices.pin_numerics()
    dist.init_process_group(devices.pick_backend(local_procs), timeout=timedelta(minutes=5))


def check(losses: list[float], cfg: GPTConfig, args: argparse.Namespace) -> int:
    """Rank 0: compare with the single-device run; the exit status."""
    single = train_single(cfg, args.steps, batch_size=args.batch_size, lr=args.lr,
                          device=device())
    worst = max((abs(a - b) for a, b in zip(single, losses, strict=True)), default=0.0)
    ok = worst <= TOLERANCE
    print(f"check: largest |single - parallel| = {worst:.2e}, tolerance {TOLERANCE:.0e}: "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    # Options that do not fit end every process before any group starts, rank 0 saying why.
    cfg = torchrun.fits_or_exit(options, lambda: model_from_args(args, torchrun.world_size()))
    init_distributed()
    status = 0
    try:
        losses = train_parallel(cfg, args.steps, dp=args.dp, tp=args.tp,
                                batch_size=args.batch_size, lr=args.lr)
        if dist.get_rank() == 0:
            print(f"{dist.get_backend()}, {dist.get_world_size()} ranks: DP {args.dp} × "
                  f"TP {args.tp}, {args.steps} steps")
            for step, loss in enumerate(losses):
                print(f"step {step:3d}  loss {loss:.6f}")
            if args.check:
                status = check(losses, cfg, args)
    finally:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
