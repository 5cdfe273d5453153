"""A small, fully deterministic training program that the resume tests start, interrupt and start again.

It draws from every generator a real training touches: dropout (torch), python's ``random`` and NumPy
(noise in the loss), a shuffling DataLoader (its per-iterator base seed). After each step it appends
``step sha`` to ``--hash-log``, where sha covers the model and optimizer state; on start it prints
``ready <restored step> <sha>``, and at the end ``final <sha>`` or ``stopped <step>``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from pathlib import Path

import numpy
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runner.checkpoint import Checkpointer, ResumableSampler  # noqa: E402


class Pad:
    """Extra state that makes each save big enough for a kill to land inside it."""

    def __init__(self, mb: float) -> None:
        self.tensor = torch.zeros(int(mb * 1024 * 1024 / 4))

    def state_dict(self) -> dict:
        return {"pad": self.tensor}

    def load_state_dict(self, state: dict) -> None:
        self.tensor.copy_(state["pad"])


def state_sha(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    for state in optimizer.state.values():
        for value in state.values():
            digest.update(value.numpy().tobytes())
    return digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> str:
    """Train; return the last result line (``final <sha>`` or ``stopped <step>``), which is also printed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--durable-url", default=None)
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--hash-log", default=None)
    parser.add_argument("--pad-mb", type=float, default=0.0)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(200, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    dataset = TensorDataset(x, y)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.98)
    sampler = ResumableSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)  # 13 batches an epoch, the last one short

    objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "sampler": sampler}
    if args.pad_mb:
        objects["pad"] = Pad(args.pad_mb)
    ckpt = Checkpointer(local_dir=args.local_dir, durable_url=args.durable_url,
                        every_steps=args.every_steps or 10**9, keep=2, **objects)
    step = ckpt.restore()
    print(f"ready {step} {state_sha(model, optimizer)}", flush=True)
    hash_log = open(args.hash_log, "a") if args.hash_log else None
    if hash_log and step == 0:
        hash_log.write(f"0 {state_sha(model, optimizer)}\n")
    while step < args.steps and not ckpt.should_stop:
        for batch_x, batch_y in loader:
            noise = random.gauss(0, 0.01) + float(numpy.random.normal(0, 0.01))
            loss = nn.functional.mse_loss(model(batch_x), batch_y + noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if hash_log:
                hash_log.write(f"{step} {state_sha(model, optimizer)}\n")
                hash_log.flush()
            if args.step_time:
                time.sleep(args.step_time)
            ckpt.step(step)
            if ckpt.should_stop or step >= args.steps:
                break
    ckpt.close()
    if hash_log:
        hash_log.close()
    result = f"stopped {step}" if ckpt.should_stop and step < args.steps else f"final {state_sha(model, optimizer)}"
    print(result, flush=True)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
