"""Quickstart: a small CPU training that survives preemption with runner.checkpoint.

    python train.py --steps 300 --step-time 0.05

Outside the runner it checkpoints to ./checkpoints; under the runner the RUNNER_* variables choose the
tiers and the agent's notices reach it. Run it, stop it with Ctrl-\\ or `kill -TERM`, run it again: it
resumes where it stopped and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from runner.checkpoint import Checkpointer, ResumableSampler
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    from runner.checkpoint import Checkpointer, ResumableSampler


def make_dataset(n: int = 512, features: int = 16) -> TensorDataset:
    """A deterministic regression problem: y = sin(x @ w) plus a little noise."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


# What ckpt.stop_reason says, for people.
WHY_STOPPED = {"notice": "a preemption", "drill": "the resume drill", "cancel": "a cancellation",
               "move": "a move to spot", "SIGTERM": "SIGTERM (a shutdown)", "SIGUSR1": "SIGUSR1"}


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra sleep per step, seconds")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--interval", default=None,
                        help="periodic checkpoint interval: 30s, 10m, auto (default: the job file's "
                             "checkpoint.interval under the runner, else auto)")
    args = parser.parse_args()

    torch.manual_seed(0)
    dataset = make_dataset()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    sampler = ResumableSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    ckpt = Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                        interval=args.interval)
    step = ckpt.restore()
    print(f"resumed from step {step}" if step else "starting fresh", flush=True)

    model.train()
    while step < args.steps and not ckpt.should_stop:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if args.step_time > 0:
                time.sleep(args.step_time)
            ckpt.step(step)
            if ckpt.should_stop or step >= args.steps:
                break
    if ckpt.should_stop and step < args.steps:
        ckpt.close()
        print(f"stopping at step {step} for {WHY_STOPPED.get(ckpt.stop_reason, ckpt.stop_reason)}; "
              "the checkpoint is committed", flush=True)
        return 0
    ckpt.save(step)  # a run started again after the end resumes here and prints the same weights
    ckpt.close()
    print(f"final weights sha256 {weights_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
