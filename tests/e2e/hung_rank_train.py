"""DDP (gloo, CPU) under torchrun whose rank HANG_RANK, in the first attempt, stops making progress after step
HANG_AFTER: it sleeps forever outside step(), ignoring SIGTERM, so every other rank waits for it at the next
step's agreement. Later attempts train to the end."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from runner.checkpoint import Checkpointer

STEPS, HANG_RANK, HANG_AFTER = (int(arg) for arg in sys.argv[1:4])

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10, interval="1h")
step = ckpt.restore()
print(f"rank {rank}: resumed from step {step}", flush=True)
while step < STEPS and not ckpt.should_stop:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    time.sleep(0.05)
    if rank == HANG_RANK and step == HANG_AFTER and os.environ.get("RUNNER_ATTEMPT") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"rank {rank}: hanging after step {step}", flush=True)
        while True:
            time.sleep(3600)
    ckpt.step(step)
ckpt.close()
print(f"rank {rank}: {'stopped' if ckpt.should_stop else 'finished'} at step {step}", flush=True)
dist.destroy_process_group()
