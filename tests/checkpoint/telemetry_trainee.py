"""A tiny collective training loop for the telemetry test: every rank passes its loss, NaN at chosen steps.

    torchrun --nproc-per-node=2 telemetry_trainee.py --steps 12 --local-dir DIR --nan RANK:STEP ...
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from runner.checkpoint import Checkpointer


def main(argv) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--nan", action="append", default=[], help="RANK:STEP whose loss is NaN")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    nan_at = {int(step) for who, step in (item.split(":") for item in args.nan) if int(who) == rank}
    model = torch.nn.Linear(4, 1)
    ballast = torch.ones(32 << 20 if rank == 1 else 1, dtype=torch.float64)  # rank 1 peaks 256 MiB higher
    ckpt = Checkpointer(model=model, local_dir=args.local_dir, every_steps=5, interval="1h")
    step = ckpt.restore()
    while step < args.steps:
        step += 1
        loss = torch.tensor(float("nan") if step in nan_at else 1.0 / step)
        ckpt.step(step, loss=loss)
    ckpt.close()
    del ballast
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
