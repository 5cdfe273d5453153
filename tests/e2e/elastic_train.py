"""DDP (gloo, CPU) in an elastic gang: rebuilt on the new default group when the world changes, the DataLoader's
iterator made anew so the sampler's reshard takes effect. Prints its pid, step and world size as it goes, and ends
when ``--finish`` names a file that exists."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runner.checkpoint import Checkpointer, ResumableSampler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--finish", help="a file whose existence ends the training (checked together every 20 steps)")
    parser.add_argument("--crash-joiner", help="a replacement's process exits 1 right after restore() unless this "
                        "file exists, which it creates (the first replacement crashes, the next one does not)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(4096, 8, generator=generator)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = ResumableSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    ckpt = Checkpointer(model=model, optimizer=optimizer, sampler=sampler, interval="1h")
    step = ckpt.restore()
    if args.crash_joiner and os.environ.get("RUNNER_ELASTIC_JOIN") == "1" and not os.path.exists(args.crash_joiner):
        open(args.crash_joiner, "w").close()
        print(f"pid {os.getpid()} crashing after it joined at step {step}", flush=True)
        os._exit(1)  # as a crash: no close(), no clean leave
    ddp = nn.parallel.DistributedDataParallel(model)
    print(f"pid {os.getpid()} rank {ckpt.rank} of {ckpt.world_size} from step {step}", flush=True)
    batches = iter(loader)
    checked = None
    while step < args.steps:
        # Every rank ends at the same step: the flag is all-reduced over the current world every 20 steps, here at
        # the top of the loop, where a replacement that joined at such a step takes part too (it enters the loop
        # at the step the survivors changed world, after its DDP build as they after their rebuild).
        if args.finish and step % 20 == 0 and step != checked:
            checked = step
            flag = torch.tensor([float(os.path.exists(args.finish))])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                break
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = nn.functional.mse_loss(ddp(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_time)
        ckpt.step(step)
        if ckpt.should_stop:
            break
        if ckpt.world_changed:
            ddp = nn.parallel.DistributedDataParallel(model)
            batches = iter(loader)
            print(f"pid {os.getpid()} step {step} world changed: rank {ckpt.rank} of {ckpt.world_size}", flush=True)
        if step % 20 == 0:
            print(f"pid {os.getpid()} step {step} world {ckpt.world_size}", flush=True)
    ckpt.close()
    print(f"pid {os.getpid()} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
