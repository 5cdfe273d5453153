"""The training script of the tests that train a small job through a notice (its ``train.py``): a linear model
with periodic commits every 10 steps, a line per step with its time, a pause between steps in the first attempt only
(it trains through the notice; a later one just finishes), and "done" at its end."""

import re

TRAINEE = """
import sys, time
import torch
from runner.checkpoint import Checkpointer

steps = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer, every_steps=10)
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)
first = step == 0
while step < steps:
    optimizer.zero_grad()
    model(torch.randn(16, 8, generator=torch.Generator().manual_seed(step))).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        print(f"stopping at step {step}", flush=True)
        break
    time.sleep(0.1 if first else 0)  # the first attempt trains through the notice; a later one just finishes
ckpt.close()
print("done", flush=True)
"""
STEP = re.compile(r"^step (\d+) at ", re.M)  # a step's line in the job's output
