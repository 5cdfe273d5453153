"""The training loop of an elastic gang, as users write it, for tests/checkpoint/test_elastic.py (gloo, CPU).

One process per node (the test's harness plays the agents). Every step appends a JSON line to
``--report``.<pid>.jsonl: the step, the world, this rank, the sample indices it trained and whether the world
changed. After each step a rank holds while the step is at or past the number in ``--gate`` (the harness
moves it), so the harness acts between known steps. At the end each rank writes its model to ``--out``.<pid>.pt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from runner.checkpoint import Checkpointer, ResumableSampler

SAMPLES = 48


class Indexed(Dataset):
    """Fixed random samples that also say which they are."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 8, generator=generator)
        self.y = torch.randn(SAMPLES, 2, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def held(gate: Path, step: int) -> bool:
    try:
        return step >= int(gate.read_text())
    except (OSError, ValueError):
        return False


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--local-dir", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--gate")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = Indexed()
    sampler = ResumableSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    ckpt = Checkpointer(model=model, optimizer=optimizer, sampler=sampler, local_dir=args.local_dir, interval="1h")
    step = ckpt.restore()
    ddp = nn.parallel.DistributedDataParallel(model)
    batches = iter(loader)
    report = open(f"{args.report}.{os.getpid()}.jsonl", "a")
    gate = Path(args.gate) if args.gate else None
    while step < args.steps:
        epoch = sampler.epoch  # before next(): drawing an epoch's last, partial batch already moves it on
        try:
            x, y, index = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        ckpt.step(step)
        report.write(json.dumps({"step": step, "world": ckpt.world_size, "rank": ckpt.rank, "pid": os.getpid(),
                                 "epoch": epoch, "indices": index.tolist(), "changed": ckpt.world_changed,
                                 "stop": ckpt.should_stop, "reason": ckpt.stop_reason}) + "\n")
        report.flush()
        if ckpt.should_stop:
            break
        if ckpt.world_changed:
            ddp = nn.parallel.DistributedDataParallel(model)
            batches = iter(loader)
        while gate is not None and held(gate, step):
            Path(f"{gate}.{os.getpid()}").write_text(str(step))
            time.sleep(0.02)
    ckpt.close()
    torch.save(model.state_dict(), f"{args.out}.{os.getpid()}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
